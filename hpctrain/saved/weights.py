"""A run's trained weights as a plain model: the newest verified checkpoint (or a chosen step),
with Final Polishing's BN statistics where the run recomputed them, built into the run's model.

The checkpoints hold the whole training state behind hpctrain's header; what leaves the run is the
model's ``state_dict`` alone. Final Polishing changes BN statistics after the final checkpoint is
written, so the job keeps the polished statistics in ``RUN_DIR/polished-bn.pt`` (checksummed
like a checkpoint, naming the checkpoint it polished by its SHA-256): they are applied to that
checkpoint only. Reading here never renames or deletes anything in the run (a resume sets a
corrupt checkpoint aside; an export only passes over it, with a warning).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
from torch import nn

from hpctrain.models import build_model
from hpctrain.models.polish import bn_layers
from hpctrain.ops.ckptdir import entries, of_run
from hpctrain.ops.ckptfile import CheckpointError, decode, encode, load, read_file, read_header, write_file
from hpctrain.saved.spec import SPEC_NAME, SavedModelError, read_spec

POLISHED_NAME = "polished-bn.pt"
COMPILED_PREFIX = "_orig_mod."      # torch.compile's wrapper names the model's own entries so


@dataclass
class SavedWeights:
    """A model's weights and what they are: the spec, the checkpoint they came from."""
    state: dict
    spec: dict
    checkpoint: str
    step: int
    polished: bool


# --- written by the job ---------------------------------------------------------------------------

def keep_polished(run_dir: str, checkpoint: str | None, model: nn.Module) -> None:
    """Rank 0, after Final Polishing: the recomputed BN statistics of ``model`` for ``checkpoint``
    (the final one). A failure is a warning: the run's result stands, only the export lacks them."""
    header = read_header(checkpoint) if checkpoint else None
    if header is None:
        return
    names = {id(m): name for name, m in model.named_modules()}
    buffers = {f"{names[id(bn)]}.{key}".lstrip("."): getattr(bn, key).detach().cpu().clone()
               for bn in bn_layers(model) for key in ("running_mean", "running_var")}
    path = os.path.join(run_dir, POLISHED_NAME)
    try:
        write_file(path, encode({"buffers": buffers}), {"checkpoint_sha256": header.get("sha256"),
                                                        "step": header.get("step")})
    except OSError as exc:
        print(f"hpctrain: warning: {path}: cannot write Final Polishing's statistics ({exc.strerror or exc}); "
              f"an export of this run has the unpolished ones", file=sys.stderr, flush=True)


# --- read back ------------------------------------------------------------------------------------

def run_weights(run_dir: str, step: int | None = None, warn=None) -> SavedWeights:
    """The model weights of run ``run_dir``: its newest checkpoint that verifies, or the one of
    ``step``; polished when ``RUN_DIR/polished-bn.pt`` belongs to that checkpoint."""
    spec = read_spec(os.path.join(run_dir, SPEC_NAME))
    directory, run_id = os.path.join(run_dir, spec["checkpoints"]), spec.get("run_id")     # relative: to run_dir
    mine = [e for e in reversed(entries(directory)) if of_run(e.path, run_id)]
    if step is not None:
        mine = [e for e in mine if e.step == step]
        if not mine:
            have = sorted({e.step for e in entries(directory) if of_run(e.path, run_id)})
            raise SavedModelError(f"{directory}: no checkpoint of step {step} (this run has steps "
                                  f"{', '.join(map(str, have)) or 'none'})")
    skipped = []
    for e in mine:
        try:       # torn, flipped or unloadable (weights_only refuses it): passed over, never renamed here
            header, payload = read_file(e.path)
            state = load(e.path, payload)["trainer"]["model"]
        except CheckpointError as exc:
            skipped.append(str(exc))
            continue
        for line in skipped if warn else ():
            warn(f"{line}; passed over")
        state = {k.removeprefix(COMPILED_PREFIX): v for k, v in state.items()}
        polished = _apply_polished(run_dir, header, state)
        return SavedWeights(state, spec, e.path, int(header["step"]), polished)
    if skipped:
        raise SavedModelError(f"no checkpoint of this run in {directory} verifies: {'; '.join(skipped)}")
    raise SavedModelError(f"{directory}: no checkpoint of run {run_dir} (has it written one?)")


def _apply_polished(run_dir: str, header: dict, state: dict) -> bool:
    path = os.path.join(run_dir, POLISHED_NAME)
    if not os.path.exists(path):
        return False
    polished_header, payload = read_file(path)      # corrupt: a CheckpointError naming it, not old stats
    if polished_header.get("checkpoint_sha256") != header.get("sha256"):
        return False                                # another checkpoint's polish (a later leg's, or a --step)
    buffers = decode(payload)["buffers"]
    unknown = set(buffers) - set(state)
    if unknown:
        raise SavedModelError(f"{path}: BN statistics for {sorted(unknown)[0]!r}, which the checkpoint lacks")
    state.update(buffers)
    return True


def build(spec: dict, state: dict | None = None) -> nn.Module:
    """The spec's model (a user's factory imported as ``model.name`` gave it) with ``state``, in eval mode."""
    model = build_model(spec["model"], num_classes=int(spec["num_classes"]),
                        in_channels=int(spec["sample_shape"][0]), **spec.get("options", {}))
    if state is not None:
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            raise SavedModelError(f"model {spec['model']!r} does not take these weights: "
                                  f"{str(exc).splitlines()[0]}") from None
    return model.eval()


def safetensors_module():
    """``safetensors.torch``, or one line saying which extra to install (an optional package:
    imported only when a safetensors file is read or written)."""
    try:
        import safetensors.torch
    except ImportError:
        raise SavedModelError("--format safetensors needs the safetensors package: "
                              "pip install 'hpctrain[safetensors]' (or pip install safetensors)") from None
    return safetensors.torch


def load_weights_file(path: str) -> dict:
    """An exported weights file: safetensors by its suffix, else a ``torch.save`` of a state_dict."""
    if path.endswith(".safetensors"):
        return dict(safetensors_module().load_file(path))
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError) as exc:
        raise SavedModelError(f"{path}: cannot read the weights ({str(exc).splitlines()[0]})") from None


def spec_beside(weights_path: str) -> str:
    """Where an export's JSON lies: the weights file's name with ``.json`` for its suffix."""
    return os.path.splitext(weights_path)[0] + ".json"


def load_model(path: str, step: int | None = None) -> nn.Module:
    """The trained model as a plain ``nn.Module`` in eval mode, from a run directory (its newest
    verified checkpoint, or ``step``; Final Polishing's statistics where the run used it) or from
    a file ``export`` wrote (its JSON beside it). A user's model factory must be importable here."""
    if os.path.isdir(path):
        saved = run_weights(path, step)
        return build(saved.spec, saved.state)
    if step is not None:
        raise SavedModelError(f"{path}: step is chosen at export (--step), not when loading an exported file")
    return build(read_spec(spec_beside(path)), load_weights_file(path))
