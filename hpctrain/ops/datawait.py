"""Is input the bottleneck? Per epoch, the share of training time spent waiting for batches, and
one warning on rank 0 once a rank has lost more than :data:`THRESHOLD` (10 %) of it, and enough
seconds to matter.

The wait is the "data" phase of :class:`~hpctrain.ops.metrics.StepTimer` (the host blocked on
the loader on the CPU; on a GPU the device idle until the batch arrives, timed by CUDA events),
over the epoch's training time (``epoch_s``: steps and checkpoints, not evaluation).

When to warn, once, when it matters:

* **The slowest-fed rank decides.** A rank on a slow node holds every other one up in the
  allreduce, where their time shows as "allreduce", not "data"; so the figures are gathered and
  the highest names its rank.
* **Not on the warm-up.** The run's first batch waits for the pipeline to fill (loader thread
  start, file opens, a cold page cache, the first decodes): paid once, not a rate, and on short
  epochs enough by itself to pass 10 %. It is left out of the judgement (not of the records).
* **Share and seconds.** At the end of each epoch, over the run so far: the rank has waited more
  than :data:`THRESHOLD` of its training time *and* at least :data:`MIN_WAIT_S` seconds in all.
  The floor keeps small runs quiet where the loss is noise (the digits demo on two busy cores
  waited 7-11 % of 3-second epochs here: a second or two in all); an ImageNet-class epoch passes it in its
  first epoch, a 10-second CIFAR epoch 10 % input-bound by the tenth. Cumulative, so one noisy
  epoch does not decide.
* **Once.** Then the per-epoch records in ``metrics.jsonl`` (``data_wait_share``,
  ``data_wait_share_max``, ``data_wait_rank``) and ``hpctrain report`` say the rest.
"""
from __future__ import annotations

import time

THRESHOLD = 0.10
MIN_WAIT_S = 10.0


def share(wait_s: float, total_s: float) -> float:
    """``wait_s / total_s``, 0 for an empty span."""
    return wait_s / total_s if total_s > 0 else 0.0


def advice(epoch: int, rank: int, wait_s: float, train_s: float) -> str:
    """The warning's one line."""
    return (f"hpctrain: warning: input is the bottleneck: rank {rank} has waited for batches "
            f"{share(wait_s, train_s):.0%} of its training time so far ({wait_s:.0f} s by the end of epoch "
            f"{epoch}, over {THRESHOLD:.0%}; the first batch's warm-up not counted); more decode workers "
            f"(data.workers) or GPU decode (data.decode=gpu) may help, see docs/data.md (said once; "
            f"metrics.jsonl has every epoch's data_wait_share)")


class InputWatch:
    """The per-epoch figures and the run's one warning. Made as the training loop starts (the
    warm-up is timed from there to :meth:`batch_arrived`'s first call). Collective: every rank
    calls :meth:`epoch` at the end of the same epochs."""

    def __init__(self, comm, threshold: float = THRESHOLD, min_wait_s: float | None = None):
        self.comm, self.threshold = comm, threshold
        self.min_wait_s = MIN_WAIT_S if min_wait_s is None else min_wait_s
        self._t0 = time.perf_counter()
        self.warmup_s: float | None = None      # the wait for the run's first batch, this rank
        self.wait_s = self.train_s = 0.0        # this run so far, warm-up left out
        self.warned = False

    def batch_arrived(self) -> None:
        """A batch is in the training loop's hands (only the run's first counts: the warm-up)."""
        if self.warmup_s is None:
            self.warmup_s = time.perf_counter() - self._t0

    def epoch(self, epoch: int, data_s: float, epoch_s: float) -> tuple[dict, str | None]:
        """This rank's and the highest share of the epoch (fields for the epoch record), and the
        warning line the first time a rank's run so far passes both bars (else None)."""
        warm = (self.warmup_s or 0.0) if self.train_s == 0.0 else 0.0
        self.wait_s += max(data_s - warm, 0.0)
        self.train_s += max(epoch_s - warm, 0.0)
        mine = share(data_s, epoch_s)
        rows = self.comm.allgather((mine, self.wait_s, self.train_s))
        worst = max(range(len(rows)), key=lambda r: rows[r][0])
        fields = {"data_wait_share": mine, "data_wait_share_max": rows[worst][0], "data_wait_rank": worst}
        judged = max(range(len(rows)), key=lambda r: share(rows[r][1], rows[r][2]))
        _, wait_s, train_s = rows[judged]
        if self.warned or share(wait_s, train_s) <= self.threshold or wait_s < self.min_wait_s:
            return fields, None
        self.warned = True
        return fields, advice(epoch, judged, wait_s, train_s)
