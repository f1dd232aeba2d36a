"""The same run at any rank count: global batches, augmentation and BatchNorm groups that do not
depend on how many ranks share them (simulated ranks in one process; the MPI side is
tests/mpi/test_rank_invariance.py)."""
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hpctrain.data import ShardLoader, ShardSet, read_index
from hpctrain.data import plan
from hpctrain.data.augment import Augment, PositionDraws
from hpctrain.errors import ConfigError
from hpctrain.job.config import Config, validate
from hpctrain.models.ghostbn import averaged_buffers, rank_dependent_norm, use_bn_groups
from hpctrain.models.small import SmallCNN

GLOBAL, LANES = 32, 8


def loaders(d, size, **kw):
    s = ShardSet(read_index(d), "train")
    opts = dict(batch_size=GLOBAL // size, seed=4, block_size=8, shuffle_window=24, prefetch=0, lanes=LANES)
    return [ShardLoader(s, rank=r, size=size, **{**opts, **kw}) for r in range(size)]


def global_ids(lds, epoch):
    """Per step, the global sample ids of the global batch: the ranks' batches side by side."""
    per_rank = []
    for r, ld in enumerate(lds):
        per_rank.append([ld.window_ids(r)[idx].copy() for _, _, idx in ld.window_batches(epoch, rank=r)])
    return [np.concatenate(parts) for parts in zip(*per_rank)]


@pytest.mark.parametrize("epoch", [0, 3])
def test_sample_ids_of_every_global_step_are_the_same_at_1_2_4_8_ranks(digits_dir, epoch):
    one = global_ids(loaders(digits_dir, 1), epoch)
    assert len(one) == loaders(digits_dir, 1)[0].steps > 20
    for size in (2, 4, 8):
        other = global_ids(loaders(digits_dir, size), epoch)
        assert len(other) == len(one)
        for k, (a, b) in enumerate(zip(one, other)):
            assert np.array_equal(a, b), (size, k)
    seen = np.concatenate(one)
    assert len(np.unique(seen)) == len(seen)                 # each sample at most once an epoch
    assert not np.array_equal(one[0], global_ids(loaders(digits_dir, 1), epoch + 1)[0])


def test_unshuffled_lanes_give_each_global_batch_their_next_runs_of_the_plan(digits_dir):
    """Independent: lane l's share of batch k is samples k·b..(k+1)·b of lane l's runs
    (plan.rank_runs over LANES 'ranks'), the lanes side by side; ranks change nothing."""
    lds = loaders(digits_dir, 2, shuffle_window=0)
    n = lds[0].shards.num_samples
    b = GLOBAL // LANES
    streams = [np.concatenate([np.arange(a, e) for a, e in plan.rank_runs(n, LANES, lane, epoch=1, seed=4,
                                                                          block_size=8)]) for lane in range(LANES)]
    for k, ids in enumerate(global_ids(lds, 1)):
        assert np.array_equal(ids, np.concatenate([s[k * b:(k + 1) * b] for s in streams])), k


def test_augmented_global_batches_are_bitwise_the_same_at_1_2_4_ranks(digits_dir):
    aug = Augment("padcrop", flip=True, pad=2)
    whole = [x for x, _ in loaders(digits_dir, 1, transform=aug)[0].epoch(2)]
    for size in (2, 4):
        parts = [[x for x, _ in ld.epoch(2)] for ld in loaders(digits_dir, size, transform=aug)]
        for k, xs in enumerate(zip(*parts)):
            assert torch.equal(torch.cat(xs), whole[k]), (size, k)
    plain = [x for x, _ in loaders(digits_dir, 1)[0].epoch(2, augment=False)]
    assert not torch.equal(plain[0], whole[0])                     # the augmentation did something


def test_default_lanes_are_one_per_rank_and_refusals_name_the_setting(digits_dir):
    s = ShardSet(read_index(digits_dir), "train")
    assert ShardLoader(s, rank=0, size=4, batch_size=8).lanes == 4
    assert "8 data lanes, 2 per rank" in ShardLoader(s, rank=0, size=4, batch_size=8, lanes=8).describe()
    with pytest.raises(ValueError, match="3 ranks do not divide its 8 lanes"):
        ShardLoader(s, rank=0, size=3, batch_size=8, lanes=8)
    cfg = Config()
    cfg.train.batch_size, cfg.data.lanes = 48, 8
    with pytest.raises(ConfigError, match=r"^config data.lanes: 3 ranks do not divide its 8 lanes"):
        validate(cfg, world_size=3)
    cfg.data.lanes, cfg.model.bn_group = 0, 16
    validate(cfg, world_size=3)                                    # local batch 16: whole groups
    with pytest.raises(ConfigError, match=r"^config model.bn_group: 16 does not divide the local batch of 12 "):
        validate(cfg, world_size=4)
    cfg = dataclasses.replace(Config(), train=dataclasses.replace(Config().train, batch_size=40))
    cfg.data.lanes = 16
    with pytest.raises(ConfigError, match="16 lanes do not divide the global batch of 40"):
        validate(cfg, world_size=2)


def test_a_samples_draws_do_not_depend_on_the_batch_that_holds_it():
    whole = PositionDraws(3, 1, 100).uniforms(64)
    assert torch.equal(torch.cat([PositionDraws(3, 1, 100 + i).uniforms(16) for i in range(0, 64, 16)]), whole)
    assert not torch.equal(PositionDraws(3, 2, 100).uniforms(64), whole)
    u = PositionDraws(0, 0, 0).uniforms(200_000)
    assert float(u.min()) >= 0 and float(u.max()) < 1
    assert torch.allclose(u.mean(0), torch.full((u.shape[1],), 0.5, dtype=torch.float64), atol=0.005)
    assert abs(float(torch.corrcoef(u.T)[0, 1])) < 0.01


def test_ghost_batchnorm_is_torchs_batchnorm_of_each_group():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2)
        bn.bias.uniform_(-1, 1)
    ref = nn.BatchNorm2d(3)
    ref.load_state_dict(bn.state_dict())
    assert use_bn_groups(bn, 4) == 1 and not rank_dependent_norm(bn) and rank_dependent_norm(ref)
    x = torch.randn(12, 3, 5, 5)
    want = torch.cat([F.batch_norm(x[i:i + 4], None, None, ref.weight, ref.bias, True) for i in range(0, 12, 4)])
    assert torch.allclose(bn(x), want, atol=1e-6)
    means = torch.stack([x[i:i + 4].mean((0, 2, 3)) for i in range(0, 12, 4)]).mean(0)
    variances = torch.stack([x[i:i + 4].var((0, 2, 3), unbiased=True) for i in range(0, 12, 4)]).mean(0)
    assert torch.allclose(bn.running_mean, 0.1 * means, atol=1e-6)
    assert torch.allclose(bn.running_var, 0.9 + 0.1 * variances, atol=1e-6)
    assert [id(t) for t in averaged_buffers(bn)] == [id(bn.running_mean), id(bn.running_var)]
    bn.eval()
    assert torch.allclose(bn(x), F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias), atol=1e-6)


def test_a_model_split_over_ranks_computes_one_process_forward_and_running_statistics():
    """Two 'ranks' holding half the groups each: outputs side by side equal one process's, and
    the mean of their running statistics (what the trainer averages) equals one process's."""
    torch.manual_seed(1)
    models = [SmallCNN() for _ in range(3)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    for m in models:
        use_bn_groups(m, 4)
    x = torch.randn(16, 1, 8, 8)
    whole = models[0](x)
    halves = torch.cat([models[1](x[:8]), models[2](x[8:])])
    assert torch.allclose(whole, halves, atol=1e-6)
    for a, b, c in zip(averaged_buffers(models[0]), averaged_buffers(models[1]), averaged_buffers(models[2])):
        assert torch.allclose(a, (b + c) / 2, atol=1e-6)
    plain = [SmallCNN() for _ in range(2)]
    plain[1].load_state_dict(plain[0].state_dict())
    assert not torch.allclose(plain[0](x), torch.cat([plain[1](x[:8]), plain[1](x[8:])]), atol=1e-4)


def test_lanes_read_runs_as_long_as_the_per_rank_plan_at_as_many_ranks(digits_dir, monkeypatch):
    """One rank reading 8 lanes makes the reads 8 ranks make with one lane each (the per-rank
    plan): a rank count changes who reads a run, not its length."""
    def lengths(lds):
        got = []
        for ld in lds:
            real = ld.shards.read_into
            monkeypatch.setattr(ld.shards, "read_into", lambda a, e, *rest, real=real: (got.append(e - a),
                                                                                       real(a, e, *rest))[1])
            list(ld.window_batches(0, rank=ld.rank))
            monkeypatch.undo()
        return sorted(got)
    one = lengths(loaders(digits_dir, 1, shuffle_window=64, lanes=8))
    eight = lengths(loaders(digits_dir, 8, shuffle_window=64, lanes=0))
    assert one == eight and np.median(one) >= 8
