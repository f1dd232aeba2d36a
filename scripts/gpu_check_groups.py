"""A command in a process group of its own, ended whole when it overruns: ``scripts/gpu-check``'s
steps. Ending only ``mpiexec`` can leave its ranks (or a job a test launched) alive, holding the
GPU for the next step; TERM to the group lets them exit cleanly, KILL ends what ignores it.
Standard library only."""
from __future__ import annotations

import os
import signal
import subprocess
import time


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies, which hold nothing, do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":      # state, ppid, pgrp
            return True
    return False


def end_group(pgid: int, grace_s: float) -> None:
    """TERM to the whole process group (``mpiexec``, its ranks, what a test launched), then KILL
    to what is left after ``grace_s``: a rank left behind would hold the GPU for the next step."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and group_alive(pgid):
            time.sleep(0.05)


def run_group(argv, timeout_s: float, env: dict, grace_s: float, cwd: str | None = None) -> tuple[int | None, str]:
    """(exit status or None on a timeout, stdout and stderr together) of ``argv`` run in a process
    group of its own, ended whole (:func:`end_group`) when it overruns ``timeout_s``."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, text
    except subprocess.TimeoutExpired:
        end_group(proc.pid, grace_s)
        try:
            text, _ = proc.communicate(timeout=grace_s)
        except subprocess.TimeoutExpired as exc:   # a process that left the group still holds the pipe
            proc.kill()
            proc.wait()
            text = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else (exc.output or "")
        return None, text
