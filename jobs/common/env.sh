# Shared by every batch script in jobs/ (sourced, not run). Finds the repository and its Python,
# reads the job shape from the scheduler, parses the script's arguments, sets the environment
# HPC sites need, builds the hpctrain command line and runs (or, with --dry-run, prints) it.
#
# Arguments of every script (flags > scheduler allocation > environment > defaults):
#   --nodes N  --ranks-per-node R  --gpus-per-node G  --cpus-per-rank C
#   --config FILE  --run-dir DIR  --resume auto|PATH|none  --script FILE  --dry-run
#   [--] [hpctrain options…, or the --script's own arguments]
# (script options first: the first unknown argument, or --, starts hpctrain's own options).
# --script FILE (HPCTRAIN_SCRIPT) runs your own training script instead of `python -m hpctrain`
# (a Horovod script on hpctrain.horovod.torch, a DDP script on hpctrain.ddp) with the same shape,
# binding, staging and signal forwarding; --config, --run-dir and --resume are hpctrain's and
# are not passed to it.
# HPCTRAIN_DRY_RUN=1 is the same as --dry-run.
# Environment: HPCTRAIN_HOME (repository; default: the submit directory), HPCTRAIN_MPI
# (openmpi, the default, or mpich: which MPI the mpirun/mpiexec scripts launch with, see
# hpctrain_launcher; MPICH-derived MPIs such as Intel MPI and MVAPICH2 use Hydra's flags too),
# HPCTRAIN_PYTHON (default HPCTRAIN_HOME/.venv/bin/python, .venv-mpich for HPCTRAIN_MPI=mpich),
# HPCTRAIN_STAGE=1 (copy the Python environment to node-local storage first, see stage.sh),
# HPCTRAIN_SITE (a file of site settings to source).

hpctrain_home() {
  # Batch systems run a spooled copy of the script, so its own path is useless: use the directory
  # the job was submitted from (or HPCTRAIN_HOME).
  HPCTRAIN_HOME=${HPCTRAIN_HOME:-${SLURM_SUBMIT_DIR:-${PBS_O_WORKDIR:-${LS_SUBCWD:-$PWD}}}}
  if [ ! -f "$HPCTRAIN_HOME/jobs/common/env.sh" ]; then
    echo "hpctrain job: $HPCTRAIN_HOME is not the hpctrain repository; submit from it or set HPCTRAIN_HOME" >&2
    return 2
  fi
  export HPCTRAIN_HOME
}

hpctrain_shape_from_scheduler() {
  if [ -n "${SLURM_JOB_ID:-}" ]; then
    NODES=${SLURM_JOB_NUM_NODES:-$NODES}
    if [ -n "${SLURM_NTASKS_PER_NODE:-}" ]; then RANKS_PER_NODE=${SLURM_NTASKS_PER_NODE%%(*}
    elif [ -n "${SLURM_NTASKS:-}" ]; then RANKS_PER_NODE=$(( SLURM_NTASKS / NODES )); fi
    local g=${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-}}
    [ -n "$g" ] && GPUS_PER_NODE=${g##*:}
    CPUS_PER_RANK=${SLURM_CPUS_PER_TASK:-$CPUS_PER_RANK}
  elif [ -n "${PBS_NODEFILE:-}" ] && [ -f "$PBS_NODEFILE" ]; then
    NODES=$(sort -u "$PBS_NODEFILE" | wc -l)
    RANKS_PER_NODE=$(( $(wc -l < "$PBS_NODEFILE") / NODES ))   # select=…:mpiprocs=R repeats each host R times
    GPUS_PER_NODE=${NGPUS:-$GPUS_PER_NODE}
  elif [ -n "${LSB_MCPU_HOSTS:-}" ]; then
    # "launch 1 node1 42 node2 42": on jsrun systems the first host with one slot is the launch node.
    set -- $LSB_MCPU_HOSTS
    [ $# -gt 2 ] && [ "$2" = 1 ] && shift 2
    NODES=$(( $# / 2 ))
  fi
}

hpctrain_parse_args() {
  DRY_RUN=${HPCTRAIN_DRY_RUN:-0}
  EXTRA=()
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) NODES=$2; shift 2 ;;
      --ranks-per-node) RANKS_PER_NODE=$2; shift 2 ;;
      --gpus-per-node) GPUS_PER_NODE=$2; shift 2 ;;
      --cpus-per-rank) CPUS_PER_RANK=$2; shift 2 ;;
      --config) CONFIG=$2; shift 2 ;;
      --run-dir) RUN_DIR=$2; shift 2 ;;
      --resume) RESUME=$2; shift 2 ;;
      --script) SCRIPT=$2; shift 2 ;;
      --dry-run) DRY_RUN=1; shift ;;
      --) shift; EXTRA=("$@"); break ;;
      *) EXTRA=("$@"); break ;;
    esac
  done
}

hpctrain_site_env() {
  # Threads: one rank per GPU (or per socket on CPUs) with its share of the cores. hpctrain sets
  # torch's threads from train.threads, which the scripts pass as the same number.
  export OMP_NUM_THREADS=$CPUS_PER_RANK
  export PYTHONUNBUFFERED=1
  # HDF5 file locking fails or serialises on Lustre/GPFS; shards are read-only.
  export HDF5_USE_FILE_LOCKING=${HDF5_USE_FILE_LOCKING:-FALSE}
  # Open MPI: skip the deprecated openib BTL (UCX drives InfiniBand). An Open MPI 4 mpirun that is
  # itself sent SIGTERM or SIGINT sends its ranks SIGCONT, waits sigkill_timeout, sends SIGTERM,
  # waits sigkill_timeout again, then SIGKILL: the value is both the delay before the ranks hear
  # of the stop and their time to agree on it and write a checkpoint (the default, 1 s, is too
  # short for a large model's checkpoint; 30 s made a killed mpirun take a minute). SIGUSR1 to
  # mpirun is forwarded at once, with no delay: the scripts' traps send it. (Set either way:
  # MPICH ignores OMPI_*. MPICH's Hydra forwards SIGTERM/SIGUSR1 to the ranks and has no kill
  # delay of its own; an MPI_Abort or a dead rank ends the whole job under both.)
  export OMPI_MCA_btl=${OMPI_MCA_btl:-^openib}
  export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-15}
  # Site-specific network settings belong in HPCTRAIN_SITE, e.g. (values depend on the machine):
  #   export OMPI_MCA_pml=ucx UCX_TLS=rc,sm,self UCX_NET_DEVICES=mlx5_0:1
  #   export NCCL_IB_HCA=mlx5_0 NCCL_SOCKET_IFNAME=ib0 NCCL_DEBUG=WARN   # when an NCCL strategy is used
  #   export FI_PROVIDER=cxi                                             # HPE Slingshot (libfabric)
  local site=${HPCTRAIN_SITE:-$HPCTRAIN_HOME/jobs/site.sh}
  # shellcheck disable=SC1090
  [ -f "$site" ] && . "$site"
  return 0
}

hpctrain_init() {
  # Usage: hpctrain_init "$@" — sets NODES RANKS_PER_NODE GPUS_PER_NODE CPUS_PER_RANK NP PY APP.
  hpctrain_home || return
  NODES=${NODES:-1} RANKS_PER_NODE=${RANKS_PER_NODE:-2} GPUS_PER_NODE=${GPUS_PER_NODE:-0}
  CPUS_PER_RANK=${CPUS_PER_RANK:-}
  CONFIG=${CONFIG:-} RUN_DIR=${RUN_DIR:-runs/job-${SLURM_JOB_ID:-${PBS_JOBID:-${LSB_JOBID:-local}}}}
  RESUME=${RESUME:-auto} SCRIPT=${HPCTRAIN_SCRIPT:-}
  hpctrain_shape_from_scheduler
  hpctrain_parse_args "$@"
  if [ -z "$CPUS_PER_RANK" ]; then
    CPUS_PER_RANK=$(( $(nproc) / RANKS_PER_NODE ))
    [ "$CPUS_PER_RANK" -ge 1 ] || CPUS_PER_RANK=1
  fi
  NP=$(( NODES * RANKS_PER_NODE ))
  export HPCTRAIN_GPUS_PER_NODE=$GPUS_PER_NODE
  hpctrain_site_env
  HPCTRAIN_MPI=${HPCTRAIN_MPI:-openmpi}
  case $HPCTRAIN_MPI in
    openmpi) ;;
    mpich) export HPCTRAIN_STAGE_VENV=${HPCTRAIN_STAGE_VENV:-.venv-mpich} \
                  HPCTRAIN_STAGE_TARS=${HPCTRAIN_STAGE_TARS:-$HPCTRAIN_HOME/.stage/mpich} ;;
    *) echo "hpctrain job: HPCTRAIN_MPI must be openmpi or mpich, got $HPCTRAIN_MPI" >&2; return 2 ;;
  esac
  PY=${HPCTRAIN_PYTHON:-$HPCTRAIN_HOME/${HPCTRAIN_STAGE_VENV:-.venv}/bin/python}
  BIND=$HPCTRAIN_HOME/jobs/common/bind.sh
  [ "$RESUME" = none ] && RESUME=""
  APP=("$PY" -m hpctrain --no-progress --run-dir "$RUN_DIR" --set "ckpt.resume=$RESUME"
       --set "train.threads=$CPUS_PER_RANK")
  [ -n "$CONFIG" ] && APP+=(--config "$CONFIG")
  APP+=("${EXTRA[@]}")
  [ -n "$SCRIPT" ] && APP=("$PY" "$SCRIPT" "${EXTRA[@]}")   # your own script, its own arguments
  cd "$HPCTRAIN_HOME" || return
}

hpctrain_show() {
  # Print a command line, shell-quoted, so it can be pasted.
  printf '%q ' "$@" | sed 's/ $//'
  echo
}

hpctrain_launch() {
  # Usage: hpctrain_launch [--stop-signal SIG] LAUNCHER…  — print (dry run) or run the launch line.
  # The launcher runs in the background so this shell can pass on SIGTERM/SIGUSR1 (scancel,
  # sbatch --signal=B:USR1@120) as STOP_SIGNAL: mpirun forwards SIGUSR1 to every rank, which
  # checkpoints and stops; srun forwards both.
  local stop=USR1
  if [ "$1" = --stop-signal ]; then stop=$2; shift 2; fi
  if [ "$DRY_RUN" = 1 ]; then
    echo "# $NODES node(s) x $RANKS_PER_NODE rank(s), $GPUS_PER_NODE GPU(s)/node, $CPUS_PER_RANK CPU(s)/rank;" \
         "OMP_NUM_THREADS=$OMP_NUM_THREADS; in $HPCTRAIN_HOME"
    [ -n "${PYTHONPATH:-}" ] && echo "# PYTHONPATH=$PYTHONPATH"
    hpctrain_show "$@"
    return 0
  fi
  mkdir -p "$RUN_DIR"
  echo "hpctrain job: $(hpctrain_show "$@")" >&2
  local started
  started=$(date +%s)
  "$@" &
  local pid=$!
  trap 'kill -s '"$stop"' '"$pid"' 2>/dev/null' TERM USR1
  local rc=0
  while :; do
    wait "$pid" && rc=0 || rc=$?
    kill -0 "$pid" 2>/dev/null || break        # wait returned because of a trapped signal: wait again
  done
  trap - TERM USR1
  # A launcher's status is not always the run's: Open MPI's mpirun exits 1 when it was itself
  # signalled, MPICH's Hydra sometimes 0 after forwarding a signal (about 1 run in 8 here), though
  # every rank stopped with 3. When the launcher says 0 or 1, the run's recorded state decides
  # (hpctrain status: 3 stopped, 4 stalled, 5 ended without a record, 6 collapsed; a state recorded before this
  # launch is not this job's); any other status is the launcher's own word.
  if [ -z "$SCRIPT" ] && { [ "$rc" = 0 ] || [ "$rc" = 1 ]; }; then
    local state=0
    "$PY" -m hpctrain status --wait 10 --since "$started" "$RUN_DIR" >&2 || state=$?
    case $state in 3|4|5|6) rc=$state ;; esac
  fi
  HPCTRAIN_RC=$rc
  return "$rc"
}

hpctrain_stopped() {
  # True if the run stopped on a signal with a checkpoint written (status 3, after hpctrain_launch).
  [ "${HPCTRAIN_RC:-}" = 3 ]
}

hpctrain_ompi_exports() {
  # Open MPI forwards only OMPI_* variables to daemons it starts with ssh, PBS tm or LSF; name
  # the rest (under Slurm, srun already copies the whole environment).
  OMPI_X=()
  local v
  for v in PATH LD_LIBRARY_PATH PYTHONPATH PYTHONUNBUFFERED OMP_NUM_THREADS HDF5_USE_FILE_LOCKING \
           HPCTRAIN_HOME HPCTRAIN_GPUS_PER_NODE UCX_TLS UCX_NET_DEVICES NCCL_IB_HCA NCCL_SOCKET_IFNAME \
           NCCL_DEBUG FI_PROVIDER HPCTRAIN_INJECT_FAULT; do
    [ -n "${!v:-}" ] && OMPI_X+=(-x "$v")
  done
  return 0
}

hpctrain_launcher() {
  # Sets LAUNCH (array): the mpirun/mpiexec line for HPCTRAIN_MPI, NP ranks, RANKS_PER_NODE per
  # node, CPUS_PER_RANK cores each. Both read the allocation (Slurm, PBS, LSF) themselves.
  #   openmpi: mpirun --map-by ppr:R:node:PE=C --bind-to core -x VAR… (forwards only what it names)
  #   mpich:   Hydra's mpiexec -ppn R -bind-to core:C (forwards the whole environment); the
  #            command is HPCTRAIN_MPIEXEC, else mpiexec.mpich where Debian installs MPICH beside
  #            Open MPI, else mpiexec.
  case $HPCTRAIN_MPI in
    openmpi)
      hpctrain_ompi_exports
      LAUNCH=(mpirun -n "$NP" --map-by "ppr:$RANKS_PER_NODE:node:PE=$CPUS_PER_RANK" --bind-to core "${OMPI_X[@]}") ;;
    mpich)
      local exe=${HPCTRAIN_MPIEXEC:-}
      [ -n "$exe" ] || { command -v mpiexec.mpich >/dev/null && exe=mpiexec.mpich || exe=mpiexec; }
      LAUNCH=("$exe" -n "$NP" -ppn "$RANKS_PER_NODE" -bind-to "core:$CPUS_PER_RANK") ;;
  esac
  return 0
}
