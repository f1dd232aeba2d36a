"""What a trained model needs besides its weights: ``RUN_DIR/model.json``, written by the training
job, and the JSON an export puts beside its weights file (the same fields plus where the weights
came from).

Enough to rebuild the network (the model name as ``model.name`` gave it, a user's
``package.module:factory`` included, with the options the job built it with) and to feed it
(sample shape and dtype, the normalisation the loader applied, the class names) without the
training data or the run's config at hand.
"""
from __future__ import annotations

import json
import os

from hpctrain.errors import UserError
from hpctrain.ops.fileio import atomic_write_text

SPEC_NAME = "model.json"
FORMAT = "hpctrain-model"
VERSION = 1
# the [model] options the job builds the model with (hpctrain.job.setup), passed to the factory again
MODEL_OPTIONS = ("batchnorm", "zero_init_residual")


class SavedModelError(UserError):
    """A run or an exported model cannot be read back (one line naming the file)."""


def model_name(name: str) -> str:
    """``model.name`` made independent of the working directory: a ``path/file.py:factory`` absolute."""
    mod, sep, attr = name.rpartition(":")
    if sep and (mod.endswith(".py") or "/" in mod or os.sep in mod):
        return f"{os.path.abspath(os.path.expanduser(mod))}:{attr}"
    return name


def run_spec(config: dict, index, run_id: str | None, checkpoints: str, run_dir: str) -> dict:
    """The spec of a run: its ``[model]`` section as built, the data's shape, classes and
    normalisation (from its shard index), and where its checkpoints are (relative to ``run_dir``
    when inside it, so a run directory copied elsewhere still finds them)."""
    inside = os.path.commonpath([os.path.abspath(checkpoints), os.path.abspath(run_dir)]) == os.path.abspath(run_dir)
    m = config["model"]
    return {"format": FORMAT, "version": VERSION, "model": model_name(m["name"]),
            "options": {k: m[k] for k in MODEL_OPTIONS if k in m},
            "num_classes": int(index.num_classes), "sample_shape": [int(d) for d in index.sample_shape],
            "dtype": index.dtype, "encoding": index.encoding, "normalize": index.normalize,
            "class_names": list(index.class_names), "dataset": config["data"]["dataset"],
            "cache_dir": config["data"]["cache_dir"], "run_id": run_id,
            "checkpoints": os.path.relpath(checkpoints, run_dir) if inside else os.path.abspath(checkpoints)}


def write_spec(path: str, spec: dict) -> None:
    atomic_write_text(path, json.dumps(spec, indent=1) + "\n")


def read_spec(path: str) -> dict:
    """A ``model.json`` (a run's or an export's); one line naming the file if it cannot serve."""
    try:
        with open(path) as fh:
            spec = json.load(fh)
    except FileNotFoundError:
        raise SavedModelError(f"{path}: missing (a run directory of hpctrain ≥ 0.1 has one; an export "
                              f"writes it beside the weights)") from None
    except (OSError, ValueError) as exc:
        raise SavedModelError(f"{path}: unreadable ({exc})") from None
    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        raise SavedModelError(f"{path}: not an hpctrain model spec (field 'format' is not {FORMAT!r})")
    if spec.get("version", 0) > VERSION:
        raise SavedModelError(f"{path}: version {spec.get('version')} is newer than this hpctrain reads "
                              f"({VERSION}); upgrade hpctrain")
    for key in ("model", "num_classes", "sample_shape", "normalize"):
        if key not in spec:
            raise SavedModelError(f"{path}: missing field {key!r}")
    return spec
