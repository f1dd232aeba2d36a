"""Running a job: what keeps it safe, observable and restartable, beside the training itself.

``checkpoint`` (save/resume; ``ckptfile`` one file, ``ckptdir`` legs, pruning, corrupt ones set
aside), ``finite`` (no non-finite result reported as done), ``rundircheck`` (run-directory
surprises at start-up), ``abort`` (one failing rank ends the job), ``agree`` (every rank
raises the same set-up error; start-up consistency check), ``signals`` (stop together on
SIGTERM/SIGUSR1), ``watchdog`` (name the stalled rank, end a stalled job), ``runlock`` (one
job per run directory, run identity), ``rundir`` (the job's run directory from start to end),
``runstate`` (``state.json``, ``hpctrain status``), ``metrics`` (step timers, JSONL),
``timeline`` (Chrome trace), ``report`` (``python -m hpctrain report``), ``fileio`` (atomic
writes), ``gpu_bind`` (a rank's GPU, chosen before MPI starts). The test hooks (fault injection)
are :mod:`hpctrain.ops.testhooks`.
"""
