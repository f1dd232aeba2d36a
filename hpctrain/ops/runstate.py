"""How a run ended, recorded in ``RUN_DIR/state.json``, and ``python -m hpctrain status RUN_DIR``.

A launcher's exit status is not always the run's: Open MPI's ``mpirun`` exits 1 when it was
itself signalled (``kill -TERM``, Ctrl-C, ``timeout``) although every rank checkpointed and
stopped with 3; MPICH's Hydra sometimes exits 0 after forwarding a signal. So the job records its
state, and ``hpctrain status`` turns it back into the documented status (the batch scripts use
it to repair the launcher's). Rank 0 writes ``running`` once it holds the run directory's lock,
then ``done``, ``stopped``, ``failed``, ``stalled`` or ``collapsed`` on the way out. A job killed outright (or
aborted by another rank's failure) cannot write: its state stays ``running`` with the lock free,
which reads as failed. Light: no MPI, no torch, so it runs on a batch node in a blink.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from collections.abc import Callable

from hpctrain.ops.fileio import WriteError, atomic_write_text, why
from hpctrain.ops.runlock import RunLock

STATE_NAME = "state.json"
# state → the job's documented exit status (running: 1, not an end)
STATUS = {"done": 0, "failed": 2, "stopped": 3, "stalled": 4, "collapsed": 6}
# the job ended without recording how (killed outright, aborted, died before taking the run
# directory): not a user error (2), not done; the batch scripts return it too
UNRECORDED = 5


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def record(run_dir: str, state: str, **fields) -> None:
    """Write the run's state (atomically; call on rank 0, holding the run directory's lock);
    :class:`~hpctrain.ops.fileio.WriteError` (one line naming the file) if it cannot be."""
    path = os.path.join(run_dir, STATE_NAME)
    try:
        atomic_write_text(path, json.dumps({"state": state, "time": now(), "unix_time": time.time(),
                                            "pid": os.getpid(), **fields}) + "\n")
    except OSError as exc:
        raise WriteError(why(exc, path)) from None


def read(run_dir: str) -> dict | None:
    try:
        with open(os.path.join(run_dir, STATE_NAME)) as fh:
            return json.loads(fh.read())
    except (OSError, ValueError):
        return None


def describe(run_dir: str, since: float | None = None) -> tuple[str, int]:
    """(one line, exit status) for the run in ``run_dir``; with ``since`` (a Unix time), a state
    recorded before it is an earlier job's: this one then ended before it could record anything."""
    holder = RunLock(run_dir).holder()
    if holder is not None:
        return f"running: {holder}", 1
    st = read(run_dir)
    if since is not None and (st is None or st.get("unix_time", 0) < since):    # none, or an earlier job's
        when = datetime.datetime.fromtimestamp(since, datetime.UTC)
        return (f"failed: no job recorded a state in {run_dir} since {when:%Y-%m-%d %H:%M:%S UTC} "
                f"(the job ended before taking the run directory; see its output)"), UNRECORDED
    if st is None:
        if os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
            return (f"failed: {run_dir} has no {STATE_NAME} (written by an hpctrain older than this one, or "
                    f"ended without a record)"), UNRECORDED
        return f"failed: no hpctrain run in {run_dir}", 2
    state, when = st.get("state"), st.get("time", "?")
    if state == "done":
        return f"done: {st.get('steps')} steps, test accuracy {100 * st.get('test_accuracy', 0):.2f}% ({when})", 0
    if state == "stopped":
        return (f"stopped by {st.get('signal')} at step {st.get('step')} after writing {st.get('checkpoint')} "
                f"({when}); continue with --set ckpt.resume=auto"), 3
    if state in ("failed", "stalled", "collapsed"):
        return f"{state}: {st.get('message')} ({when})", STATUS[state]
    return (f"failed: the job started {when} (pid {st.get('pid')}) ended without recording how: killed, "
            f"or aborted by a rank's failure (see its output)"), UNRECORDED


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpctrain status",
                                 description="Print how the run in RUN_DIR ended; exit 0 done, 3 stopped (checkpoint "
                                             "written), 2 failed, 4 stalled (ended by the watchdog), 5 ended without a "
                                             "record (killed, aborted), 6 collapsed (the training loss back at "
                                             "chance, or never away from it), 1 still running.")
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument("--since", type=float, metavar="UNIX_TIME",
                    help="the job started then: an older record is an earlier job's (the batch scripts pass it)")
    ap.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                    help="while the lock is still held, ask again for up to SECONDS: a launcher can return "
                         "before its aborted ranks have exited (the batch scripts pass 10)")
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    deadline = time.monotonic() + max(args.wait, 0.0)
    line, status = describe(args.run_dir, args.since)
    while status == 1 and time.monotonic() < deadline:
        time.sleep(0.2)
        line, status = describe(args.run_dir, args.since)
    print(f"hpctrain: {line}")
    return status


def record_exit(run_dir: str, enabled: bool) -> Callable[..., bool]:
    """An ``ExitStack`` exit callback recording ``failed`` (with the error's line) when the block
    raises anything but a stop; ``done`` and ``stopped`` are recorded by the job with their details."""
    from hpctrain.errors import UserError
    from hpctrain.ops.signals import Stopped

    def exit_(exc_type, exc, tb):
        if enabled and exc_type is not None and not issubclass(exc_type, Stopped):
            message = str(exc) if issubclass(exc_type, UserError) else f"{exc_type.__name__}: {exc}"
            try:
                record(run_dir, getattr(exc_type, "run_state", "failed"), message=message)
            except (OSError, WriteError):
                pass                          # the error itself is what the user must see
        return False
    return exit_
