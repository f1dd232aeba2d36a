"""Evaluation and Final Polishing keep their totals on the model's device and read them once:
no host copy per batch (evaluation) or per BN layer per batch (polishing). On the CPU the
"device" is the CPU, so the reads are counted by patching ``Tensor.cpu``/``item``/``__bool__``/
``__float__``; the values are checked against torch's own computation over the whole data."""
import contextlib

import pytest
import torch
from mpi4py import MPI

from hpctrain.models.scores import Scores
from hpctrain.models.polish import recompute_bn_stats
from hpctrain.ops.finite import NO_SAMPLE


@contextlib.contextmanager
def counted_reads(monkeypatch):
    reads = []
    with monkeypatch.context() as m:
        for name in ("cpu", "item", "__bool__", "__float__", "tolist"):
            real = getattr(torch.Tensor, name)
            m.setattr(torch.Tensor, name, lambda self, *a, _r=real, _n=name, **k: reads.append(_n) or _r(self, *a, **k))
        yield reads


def batches(n_batches=5, bs=7, n_cls=4, bad=None):
    g = torch.Generator().manual_seed(1)
    out = []
    for b in range(n_batches):
        logits = torch.randn(bs, n_cls, generator=g)
        if bad is not None and b == bad[0]:
            logits[bad[1], 0] = float("nan")
        out.append((logits, torch.randint(0, n_cls, (bs,), generator=g)))
    return out


@pytest.mark.parametrize("bad", [None, (2, 3)])
def test_scores_read_once_and_match_torch(bad, monkeypatch):
    data = batches(bad=bad)
    scores = Scores("cpu", first_index=100)
    with counted_reads(monkeypatch) as reads:
        for out, y in data:
            scores.add(out, y)
        assert reads == []                      # nothing read while batches go by
        correct, top_k, loss_sum, count, first_bad = scores.read()
    assert reads.count("cpu") == 1
    logits, y = torch.cat([o for o, _ in data]), torch.cat([t for _, t in data])
    losses = torch.nn.functional.cross_entropy(logits, y, reduction="none")
    assert count == len(y) and correct == float((logits.argmax(1) == y).sum())
    in_top5 = (logits.argsort(1, descending=True)[:, :5] == y[:, None]).any(1)
    assert top_k == float(in_top5.sum())
    if bad is None:
        assert first_bad == NO_SAMPLE
        assert loss_sum == pytest.approx(float(losses.double().sum()), rel=1e-6)
    else:
        assert first_bad == 100 + bad[0] * 7 + bad[1]


def test_polish_reads_each_layer_once_not_per_batch(monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.Conv2d(4, 5, 3), torch.nn.BatchNorm2d(5))
    xs = [torch.randn(6, 3, 9, 9) for _ in range(4)]
    with counted_reads(monkeypatch) as reads:
        n = recompute_bn_stats(model, xs, MPI.COMM_SELF)
    assert n == 24 and reads.count("cpu") <= 1      # before: 2 per BN layer per batch (16)
    with torch.no_grad():
        h = model[0](torch.cat(xs))                 # the first BN's input over all samples
    torch.testing.assert_close(model[1].running_mean, h.mean((0, 2, 3)))
    torch.testing.assert_close(model[1].running_var, h.var((0, 2, 3), unbiased=True))
