"""``mpiexec -n N python -m hpctrain evaluate RUN_DIR [--data SHARDS] [--split test]``: top-1,
top-5 and mean loss of a run's trained model over a whole split of any shard set.

The model is the one :func:`~hpctrain.saved.weights.run_weights` reads (newest verified
checkpoint or ``--step``, Final Polishing's statistics where the run used them). Samples are
normalised as the model was trained (the run's normalisation, not the evaluated set's), so a set
converted on its own statistics is still fed what the model expects. Each rank scores a contiguous
share and one ``Allreduce`` sums them: the figures do not depend on the number of ranks.
Rank 0 reads and verifies the checkpoint and broadcasts it; CPU only.
"""
from __future__ import annotations

import argparse
import sys

import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.data import BatchPrep, Normalize, ShardSet, eval_batches, read_index
from hpctrain.data_tools.builtin import resolve_dataset
from hpctrain.errors import UserError
from hpctrain.models.scores import Scores, has_top_k
from hpctrain.ops.agree import agree
from hpctrain.saved.spec import SavedModelError
from hpctrain.saved.weights import SavedWeights, build, run_weights


def mismatch(spec: dict, index, where: str) -> str | None:
    """One line naming both sides when the shards cannot feed the model, else None."""
    sides = [("classes", int(spec["num_classes"]), int(index.num_classes)),
             ("sample shape", tuple(spec["sample_shape"]), tuple(index.sample_shape)),
             ("sample dtype", spec.get("dtype", index.dtype), index.dtype)]
    for what, model_side, data_side in sides:
        if model_side != data_side:
            return (f"{where} has {what} {data_side}, but the model was trained on {what} {model_side} "
                    f"({spec.get('dataset')})")
    return None


def score(model: torch.nn.Module, batches, comm: MPI.Comm, num_classes: int) -> dict:
    """Collective: top-1, top-5 (more than 5 classes) and mean loss of ``model`` over every rank's batches."""
    scores = Scores(torch.device("cpu"))
    with torch.no_grad():
        for x, y in batches:
            scores.add(model(x), y)
    totals = scores.read()
    correct, top_k, loss_sum, count = comm_lib.allreduce_sum(
        [totals.correct, totals.top_k, totals.loss_sum, totals.samples], comm)
    result = {"top1": correct / count if count else 0.0, "loss": loss_sum / count if count else 0.0,
              "samples": int(count)}
    if has_top_k(num_classes):
        result["top5"] = top_k / count
    return result


def evaluate(run_dir: str, comm: MPI.Comm, data: str | None = None, split: str = "test",
             step: int | None = None, batch_size: int = 256) -> tuple[dict, SavedWeights]:
    """Collective: the scores of ``run_dir``'s model over ``split`` of ``data`` (default: the run's
    own data set). A problem on any rank is one :class:`UserError` raised on every rank."""
    saved: SavedWeights | None = None
    error: BaseException | str | None = None
    if comm.Get_rank() == 0:
        try:
            saved = run_weights(run_dir, step, warn=lambda line: print(f"hpctrain: warning: {line}",
                                                                       file=sys.stderr, flush=True))
        except UserError as exc:
            error = exc
    agree(comm, error)
    saved = comm.bcast(saved, root=0)
    assert saved is not None                # agree raised otherwise
    spec, dataset = saved.spec, data or saved.spec["dataset"]
    model, index = None, None
    try:       # a user's model factory must import on every rank; the shards must fit the model
        model = build(spec, saved.state)
        index = read_index(resolve_dataset(dataset, spec.get("cache_dir", "~/.cache/hpctrain"), comm))
        error = mismatch(spec, index, dataset)
    except UserError as exc:
        error = exc
    agree(comm, error)
    assert model is not None and index is not None
    shards = None
    try:
        shards = ShardSet(index, split, comm=comm)
        shards.check()
    except UserError as exc:
        error = exc
    try:
        agree(comm, error)
        assert shards is not None
        prep = BatchPrep(Normalize(spec["normalize"], int(spec["sample_shape"][0])))
        batches = ((prep(x), y) for x, y in eval_batches(shards, rank=comm.Get_rank(), size=comm.Get_size(),
                                                          batch_size=batch_size, raw=True))
        result = score(model, batches, comm, int(spec["num_classes"]))
        return {**result, "dataset": dataset, "split": split, "step": saved.step, "polished": saved.polished}, saved
    finally:
        if shards is not None:
            shards.close()


def format_result(r: dict, run_dir: str, ranks: int) -> str:
    top5 = f" | top-5 {100 * r['top5']:.2f}%" if "top5" in r else ""
    polish = ", Final Polishing's BN statistics" if r["polished"] else ""
    return (f"{run_dir} step {r['step']}{polish} on {r['dataset']} {r['split']} ({r['samples']} samples, "
            f"{ranks} ranks): top-1 {100 * r['top1']:.2f}%{top5} | loss {r['loss']:.4f}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpctrain evaluate",
                                 description="Score a run's trained model (top-1, top-5, loss) on a split of "
                                             "any shard set; launch with mpiexec -n N to share the work.")
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument("--data", metavar="SHARDS", help="shard directory or built-in data set (default: the run's)")
    ap.add_argument("--split", default="test", help="split to score (default: test)")
    ap.add_argument("--step", type=int, help="the checkpoint of this step (default: the newest that verifies)")
    ap.add_argument("--batch-size", type=int, default=256, help="samples per forward pass on each rank")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    try:
        result, _ = evaluate(args.run_dir, comm, args.data, args.split, args.step, args.batch_size)
    except UserError as exc:
        if comm.Get_rank() == 0:
            print(f"hpctrain: error: {exc}", file=sys.stderr)
        return 2
    if comm.Get_rank() == 0:
        print(format_result(result, args.run_dir, comm.Get_size()), flush=True)
    return 0


__all__ = ["SavedModelError", "evaluate", "format_result", "main", "mismatch", "score"]
