"""GPU binding by the rank on the physical host, chosen before MPI starts (issue 22, finding 10).

No GPU here: torch.cuda's device calls are replaced by recording fakes."""
import subprocess
import sys
import types

import pytest
import torch

from hpctrain import api
from hpctrain.ops import gpu_bind


@pytest.mark.parametrize("env,want", [
    ({}, None),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}, 3),
    ({"MPI_LOCALRANKID": "2"}, 2),
    ({"SLURM_LOCALID": "1"}, 1),
    # mpiexec inside a batch step: the step's SLURM_LOCALID (0) is inherited by every rank
    ({"SLURM_LOCALID": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "5"}, 5),
    ({"MPI_LOCALRANKID": "", "SLURM_LOCALID": "x"}, None),
])
def test_launcher_local_rank(env, want):
    assert gpu_bind.launcher_local_rank(env) == want


class FakeCudaDevices:
    def __init__(self, monkeypatch, n=4):
        self.bound = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "set_device", self.bound.append)


def test_early_bind_uses_the_launcher_rank_and_only_where_asked(monkeypatch):
    fake = FakeCudaDevices(monkeypatch, n=4)
    env = {"OMPI_COMM_WORLD_LOCAL_RANK": "6"}
    assert gpu_bind.early_bind("auto", env) == 2 and fake.bound == [2]
    assert gpu_bind.early_bind("cpu", env) is None
    assert gpu_bind.early_bind(None, env) is None
    assert gpu_bind.early_bind("cuda", {}) is None      # no launcher variable: bind_device decides
    assert fake.bound == [2]


def test_bind_device_ignores_the_emulated_layout(monkeypatch):
    """comm.ranks_per_node=1 makes every rank local rank 0 of its emulated node; on a real
    4-GPU host rank 3 must still bind cuda:3 (its rank on the host), not cuda:0."""
    fake = FakeCudaDevices(monkeypatch, n=4)
    for name in gpu_bind.LOCAL_RANK_VARS:
        monkeypatch.delenv(name, raising=False)
    topo = types.SimpleNamespace(local_rank=0, host_local_rank=3, physical_local_rank=3)
    assert api.bind_device(topo, "auto") == torch.device("cuda", 3) and fake.bound == [3]
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")      # the launcher's word first
    assert api.bind_device(topo, "cuda") == torch.device("cuda", 1) and fake.bound == [3, 1]


def test_cli_binds_before_mpi_is_initialised(tmp_path):
    """The CLI asks for the device before mpi4py.MPI is imported (MPI_Init)."""
    code = ("import sys; from hpctrain.ops import gpu_bind\n"
            "seen = []\n"
            "def bind(want):\n"
            "    seen.append((want, 'mpi4py.MPI' in sys.modules))\n"
            "    raise KeyboardInterrupt\n"            # stop here: only the order is asked
            "gpu_bind.early_bind = bind\n"
            "from hpctrain.job import entry\n"
            "try:\n"
            "    entry.train_main(['--set', 'train.device=cuda', '--run-dir', sys.argv[1]])\n"
            "except KeyboardInterrupt:\n"
            "    pass\n"
            "print(seen)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert "[('cuda', False)]" in r.stdout, (r.stdout, r.stderr[-2000:])
