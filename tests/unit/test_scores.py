"""Top-k counts against a count by rank: a sample is in its top k when fewer than k logits beat its target's."""
import torch

from hpctrain.models.scores import has_top_k, top_k_hits


def by_rank(logits, targets, k):
    target = logits.gather(1, targets.view(-1, 1))
    return int(((logits > target).sum(1) < k).sum())


def test_top_k_matches_a_count_by_rank():
    gen = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(500, 10, generator=gen), torch.randint(0, 10, (500,), generator=gen)
    for k in (1, 3, 5):
        assert int(top_k_hits(logits, targets, k)) == by_rank(logits, targets, k)
    assert int(top_k_hits(logits, targets, 1)) == int((logits.argmax(1) == targets).sum())


def test_top5_only_with_more_than_five_classes():
    logits, targets = torch.randn(7, 4), torch.randint(0, 4, (7,))
    assert int(top_k_hits(logits, targets, 5)) == 7          # k beyond the classes: every sample
    assert not has_top_k(5) and has_top_k(6)
