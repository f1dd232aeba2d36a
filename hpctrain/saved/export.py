"""``python -m hpctrain export RUN_DIR OUT [--step N] [--format torch|safetensors]``: a run's
trained weights as a plain ``state_dict`` that another program reads without hpctrain
(``torch.load(OUT, weights_only=True)``, or safetensors' ``load_file``), with its model spec
beside it as JSON (:mod:`~hpctrain.saved.spec`). Serial: one process, no MPI.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from hpctrain.errors import UserError
from hpctrain.ops.fileio import atomic_open
from hpctrain.saved.spec import SavedModelError, write_spec
from hpctrain.saved.weights import SavedWeights, run_weights, safetensors_module, spec_beside

FORMATS = ("torch", "safetensors")


def export(run_dir: str, out: str, step: int | None = None, fmt: str = "torch", warn=None) -> SavedWeights:
    """Write ``run_dir``'s weights to ``out`` and the spec to :func:`spec_beside` ``(out)``, both atomically."""
    if fmt not in FORMATS:
        raise SavedModelError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    if out.endswith(".json"):
        raise SavedModelError(f"{out}: the weights need another name (the spec is written beside them as .json)")
    writer = safetensors_module() if fmt == "safetensors" else None
    saved = run_weights(run_dir, step, warn)
    # plain, dense CPU tensors: a channels_last or shared-storage tensor would carry its layout along
    state = {k: v.detach().cpu().contiguous().clone() for k, v in saved.state.items()}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with atomic_open(out, "wb") as fh:
        if writer is not None:
            fh.write(writer.save(state))
        else:
            torch.save(state, fh)
    write_spec(spec_beside(out), {**saved.spec, "weights": os.path.basename(out), "weights_format": fmt,
                                  "checkpoint": os.path.abspath(saved.checkpoint), "step": saved.step,
                                  "polished": saved.polished})
    return saved


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpctrain export",
                                 description="Write a run's trained model weights as a plain state_dict "
                                             "(torch.load(OUT, weights_only=True)) and its spec as JSON beside it.")
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument("out", metavar="OUT", help="weights file to write; the spec goes to OUT's name with .json")
    ap.add_argument("--step", type=int, help="the checkpoint of this step (default: the newest that verifies)")
    ap.add_argument("--format", choices=FORMATS, default="torch", dest="fmt")
    args = ap.parse_args(argv)
    try:
        saved = export(args.run_dir, args.out, args.step, args.fmt,
                       warn=lambda line: print(f"hpctrain: warning: {line}", file=sys.stderr))
    except UserError as exc:
        print(f"hpctrain: error: {exc}", file=sys.stderr)
        return 2
    print(f"exported step {saved.step} of {args.run_dir} ({'with' if saved.polished else 'without'} Final "
          f"Polishing's BN statistics) to {args.out}; spec {spec_beside(args.out)}")
    return 0
