"""A checkpoint whose digest matches but whose payload cannot be loaded is set aside like a corrupt one."""
import fractions
import io
import os

import pytest
import torch
from mpi4py import MPI
from torch import nn

from hpctrain.ops import checkpoint as ck
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer


def _trainer(topo, seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    return DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), topo)


def _refused_by_weights_only() -> bytes:
    buf = io.BytesIO()
    torch.save({"step": 3, "x": fractions.Fraction(1, 3)}, buf)    # not a type the weights_only loader allows
    return buf.getvalue()


def _plant(directory, step, payload):
    path = os.path.join(directory, ck.checkpoint_name(step))
    ck.write_file(path, payload, {"step": step, "samples_seen": 1000})   # newest work; its digest matches
    return path


@pytest.mark.parametrize("payload", [_refused_by_weights_only(), os.urandom(5000),
                                     ck.encode({"step": 3, "something": "else"})],
                         ids=["weights-only-refuses", "random-bytes", "not-a-checkpoint"])
def test_resume_auto_sets_an_unloadable_newest_aside_and_falls_back(tmp_path, payload, capsys):
    topo = Topology.create(MPI.COMM_SELF)
    try:
        a = _trainer(topo, 0)
        a.step(torch.randn(8, 4), torch.randint(0, 3, (8,)))
        saver = ck.Checkpointer(MPI.COMM_SELF, str(tmp_path), steps_per_epoch=10, global_batch=8, config={})
        good = saver.save(a)
        bad = _plant(str(tmp_path), 3, payload)
        ck.read_file(bad)                                   # the digest does match
        b = _trainer(topo, 7)
        pos = ck.Checkpointer(MPI.COMM_SELF, str(tmp_path), steps_per_epoch=10, global_batch=8,
                              config={}).resume(b, "auto")
        assert pos.step == 1 and good.endswith(ck.checkpoint_name(1))
        for pa, pb in zip(a.model.parameters(), b.model.parameters()):   # the older one's weights, loaded
            assert torch.equal(pa, pb)
        assert not os.path.exists(bad) and open(bad + ".corrupt", "rb").read().endswith(payload)   # evidence kept
        err = capsys.readouterr().err
        assert "ckpt-000000003.pt: digest matches but the payload" in err and "weights_only=False" not in err
        assert "Traceback" not in err
        with pytest.raises(ck.CheckpointError, match=r"ckpt-000000003\.pt\.corrupt: digest matches but"):
            ck.Checkpointer(MPI.COMM_SELF, str(tmp_path), steps_per_epoch=10, global_batch=8,
                            config={}).resume(b, bad + ".corrupt")         # by path: one line, not loaded
    finally:
        topo.close()


def test_only_unloadable_checkpoints_refuse_the_resume_in_one_line(tmp_path):
    _plant(str(tmp_path), 4, os.urandom(300))
    with pytest.raises(ck.CheckpointError, match="no checkpoint of this run .* verifies .*ckpt-000000004.pt.corrupt"):
        ck.newest_valid(str(tmp_path), check=ck.load)
