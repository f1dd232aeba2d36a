"""pytest plugin (``-p tests.schedule_log``): where a parallel test run's wall time goes.

With ``HPCTRAIN_TEST_SCHEDULE=FILE`` set, every test appends one JSON line to FILE: the xdist
worker that ran it, its node id, its start and end (epoch seconds, setup and teardown included)
and the CPU seconds it used, its own process's and those of the processes it started and waited
for (the MPI jobs a test launches: a lower bound where a signalled launcher exits before reaping
its ranks). ``scripts/test-schedule`` reads the file: per-worker busy time, the CPU against the
wall, the longest files and tests. Without the variable it does nothing.
"""
import json
import os
import resource
import time

import pytest

PATH = os.environ.get("HPCTRAIN_TEST_SCHEDULE")


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not PATH:
        yield
        return
    t0, c0 = time.time(), _cpu()
    yield
    rec = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "test": item.nodeid,
           "start": t0, "end": time.time(), "cpu": _cpu() - c0}
    with open(PATH, "a") as fh:          # one short line per write: appends do not interleave
        fh.write(json.dumps(rec) + "\n")
