"""comm.overlap on a GPU calls MPI from autograd's device thread: refused at start-up, in one
line naming the thread level, where MPI gives less than MPI_THREAD_MULTIPLE (in process: the
job's set-up refuses before it touches the device)."""
import pytest
import torch
from mpi4py import MPI

from hpctrain.comm.threads import overlap_unsupported
from hpctrain.errors import ConfigError
from hpctrain.job import setup as job_setup
from hpctrain.job.config import Config

CUDA = torch.device("cuda:0")


@pytest.mark.parametrize("level, name", [(MPI.THREAD_SINGLE, "MPI_THREAD_SINGLE"),
                                         (MPI.THREAD_FUNNELED, "MPI_THREAD_FUNNELED"),
                                         (MPI.THREAD_SERIALIZED, "MPI_THREAD_SERIALIZED")])
def test_overlap_on_cuda_needs_thread_multiple(level, name):
    why = overlap_unsupported(True, CUDA, level)
    assert why is not None and "\n" not in why
    assert name in why and "MPI_THREAD_MULTIPLE" in why and "comm.overlap=false" in why


def test_what_runs_on_the_main_thread_or_with_multiple_is_fine():
    assert overlap_unsupported(True, CUDA, MPI.THREAD_MULTIPLE) is None
    assert overlap_unsupported(False, CUDA, MPI.THREAD_SINGLE) is None
    assert overlap_unsupported(True, torch.device("cpu"), MPI.THREAD_SINGLE) is None   # hooks: caller's thread


def test_the_job_refuses_at_start_up(monkeypatch):
    monkeypatch.setattr(MPI, "Query_thread", lambda: MPI.THREAD_SERIALIZED)
    cfg = Config()
    cfg.comm.overlap = True
    with pytest.raises(ConfigError, match="^config comm.overlap=true on cuda:0 .*provides MPI_THREAD_SERIALIZED"):
        job_setup._model_and_optimizer(cfg, None, None, CUDA)
    cfg.comm.overlap = False    # the same job without overlap goes past the check (and fails later, on index)
    with pytest.raises(AttributeError):
        job_setup._model_and_optimizer(cfg, None, None, CUDA)
