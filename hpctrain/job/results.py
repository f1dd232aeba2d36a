"""What a run measures: exact evaluation over the test split (each epoch where asked, and at the
end), Final Polishing, and the summary line of metrics.jsonl from the loop's
:class:`~hpctrain.job.state.Progress`. Collective."""
from __future__ import annotations

import itertools
import time

import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.data import eval_batches, eval_prep
from hpctrain.data.plan import block_range
from hpctrain.job.batches import device_batches
from hpctrain.job.state import Job, Progress
from hpctrain.models.polish import recompute_bn_stats
from hpctrain.models.scores import Scores, has_top_k
from hpctrain.ops.finite import NO_SAMPLE, check_result
from hpctrain.ops.metrics import MetricsLog, gpu_time


def evaluate(job: Job, batch_size: int = 256) -> dict:
    """Exact accuracy and mean loss over the whole test split (each rank scores its share); with
    ``test_nonfinite_sample``, the first sample whose loss is not finite, if any (:mod:`~hpctrain.ops.finite`)."""
    topo = job.topo
    scores = Scores(job.device, block_range(job.test_set.num_samples, topo.size, topo.rank)[0])
    # every rank scores the same model: the update in flight done, rank 0's BN statistics
    pool = job.loader.jpeg.pool if job.loader.jpeg else None            # JPEG: the training loader's decode pool
    batches = eval_batches(job.test_set, rank=topo.rank, size=topo.size, batch_size=batch_size,
                           raw=job.normalise_on_device, pool=pool)
    prep = eval_prep(job.test_set) if job.normalise_on_device else None
    with job.trainer.evaluation() as model, torch.no_grad():
        for x, y in device_batches(batches, job.device, prep):
            scores.add(model(x), y)         # totals stay on the device: read once below
    totals = scores.read()
    first_bad = totals.first_bad
    correct, top_k, loss_sum, count = comm_lib.allreduce_sum(
        [totals.correct, totals.top_k, totals.loss_sum, totals.samples], topo.comm)
    result = {"test_accuracy": correct / count, "test_loss": loss_sum / count, "test_samples": int(count)}
    if has_top_k(job.test_set.index.num_classes):
        result["test_top5_accuracy"] = top_k / count
    first_bad = topo.comm.allreduce(first_bad, op=MPI.MIN)
    return result if first_bad == NO_SAMPLE else {**result, "test_nonfinite_sample": first_bad}


def polish(job: Job) -> dict:
    """Final Polishing: BN statistics recomputed on un-augmented training data, then re-evaluated."""
    epochs, bn_batches = job.options.epochs, job.options.polish_batches
    batches = job.loader.epoch(epochs, augment=False)
    if bn_batches:
        batches = itertools.islice(batches, bn_batches)
    prep = job.loader.batch_prep(epochs, augment=False)
    with job.timer.span("polish"):
        recompute_bn_stats(job.model, device_batches(batches, job.device, prep), job.topo.comm)
    return evaluate(job)


def summarise(job: Job, log: MetricsLog, progress: Progress, t0: float) -> dict:
    """Final evaluation (and Final Polishing), then the summary line of metrics.jsonl. Collective."""
    options, topo, loader = job.options, job.topo, job.loader
    result = evaluate(job)
    if options.polish:
        result = {**polish(job), "test_accuracy_before_polish": result["test_accuracy"]}
    check_result(result, "test", ("test_loss", "test_accuracy"), "in the final evaluation",
                 result.get("test_nonfinite_sample", NO_SAMPLE))
    steps, train_s, wall_s = job.trainer.step_count, progress.train_s, time.perf_counter() - t0
    epochs_here = (steps - progress.start_step) / loader.steps    # this run's share, when resumed
    return log.log("summary", **result, samples_per_s=progress.samples / train_s, wall_s=wall_s,
                   train_s=train_s, world_size=topo.size, steps=steps, epochs=steps / loader.steps,
                   global_batch=loader.global_batch, skipped_steps=int(progress.skipped),
                   train_loss=progress.train_loss,
                   num_classes=loader.shards.index.num_classes,
                   strategy=options.strategy, compression=options.compression, algorithm=options.algorithm,
                   phases_s=progress.breakdown,
                   data_wait_share=progress.breakdown.get("data", 0.0) / train_s if train_s else 0.0,
                   start_step=progress.start_step, **gpu_time(wall_s, topo.size, epochs_here))
