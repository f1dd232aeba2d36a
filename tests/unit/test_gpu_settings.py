"""GPU settings from ``[train]`` and the one-rank route (issue 22, finding 11), without a GPU."""
import types

import torch

from hpctrain.job import gpu_settings
from hpctrain.comm import staging
from hpctrain.job.config import Config


def fake_backends():
    return types.SimpleNamespace(cudnn=types.SimpleNamespace(benchmark=None),
                                 cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=None)))


def test_defaults_and_flags_set_from_the_config():
    train = Config().train
    assert train.cudnn_benchmark is True and train.tf32 is False and train.channels_last is False
    b = fake_backends()
    assert gpu_settings.apply(cudnn_benchmark=train.cudnn_benchmark, tf32=train.tf32, backends=b) == {"cudnn.benchmark": True, "cuda.matmul.allow_tf32": False}
    train.cudnn_benchmark, train.tf32 = False, True
    gpu_settings.apply(cudnn_benchmark=train.cudnn_benchmark, tf32=train.tf32, backends=b)
    assert b.cudnn.benchmark is False and b.cuda.matmul.allow_tf32 is True


def test_channels_last_model():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    assert gpu_settings.model_memory_format(model, False)[0].weight.is_contiguous()
    w = gpu_settings.model_memory_format(model, True)[0].weight
    assert w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()


def test_one_rank_never_stages_a_cuda_bucket():
    """One rank: a CUDA bucket of a strategy that reduces its own buffers is kept on the device
    without asking the MPI library (nothing crosses: no device -> host -> device round trip)."""
    def never():
        raise AssertionError("MPI asked")
    assert staging.direct_route("cuda", forced=False, direct_ok=True, one_rank=True, mpi_takes=never)
    assert not staging.direct_route("cuda", forced=False, direct_ok=False, one_rank=True, mpi_takes=never)
    assert not staging.direct_route("cpu", forced=False, direct_ok=True, one_rank=True, mpi_takes=never)
    # several ranks, or CPU stand-ins: the MPI library's answer
    assert staging.direct_route("cuda", forced=False, direct_ok=True, one_rank=False, mpi_takes=lambda: True)
    assert not staging.direct_route("cuda", forced=False, direct_ok=True, one_rank=False, mpi_takes=lambda: False)
    assert not staging.direct_route("cpu", forced=True, direct_ok=True, one_rank=True, mpi_takes=lambda: False)
