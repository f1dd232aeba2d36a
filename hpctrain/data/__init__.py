"""Data: the shard format, the per-epoch block plan, the per-rank loader, augmentation.

``train_loader`` / ``open_split`` (``factory.py``) build them from the ``[data]`` options, given
by name.
"""
from hpctrain.data.augment import Augment, BatchPrep, Normalize
from hpctrain.data.evalbatches import eval_batches, eval_prep
from hpctrain.data.factory import open_split, train_loader
from hpctrain.data.index import ShardError, ShardIndex, read_index
from hpctrain.data.loader import LoaderStats, ShardLoader
from hpctrain.data.plan import block_range, rank_runs, steps_per_epoch
from hpctrain.data.shards import ShardSet

__all__ = ["Augment", "BatchPrep", "Normalize", "open_split", "train_loader", "LoaderStats", "ShardLoader",
           "eval_batches", "eval_prep", "block_range", "rank_runs", "steps_per_epoch", "ShardError", "ShardIndex",
           "ShardSet", "read_index"]
