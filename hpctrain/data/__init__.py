"""Data: the shard format, the per-epoch block plan and the per-rank loader."""
from hpctrain.data.loader import ShardLoader, eval_batches
from hpctrain.data.plan import block_range, rank_runs, steps_per_epoch
from hpctrain.data.shards import ShardError, ShardIndex, ShardSet, read_index

__all__ = ["ShardLoader", "eval_batches", "block_range", "rank_runs", "steps_per_epoch",
           "ShardError", "ShardIndex", "ShardSet", "read_index"]
