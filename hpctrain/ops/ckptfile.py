"""One checkpoint file: a magic line, a one-line JSON header, the payload (``torch.save`` bytes).

The header holds the format version, SHA-256 and length of the payload and what orders and
identifies the checkpoint without reading the payload: step, epoch, world size, run id, leg and
samples seen (:mod:`hpctrain.ops.ckptdir`). Written atomically (:func:`hpctrain.ops.fileio.atomic_open`):
a job killed mid-write leaves only a stray temporary file.
"""
from __future__ import annotations

import hashlib
import io
import json

import torch

from hpctrain.errors import UserError
from hpctrain.ops.fileio import atomic_open
from hpctrain.ops.testhooks import maybe_kill

FORMAT_VERSION = 1
MAGIC = b"HPCTRAIN-CHECKPOINT\n"


class CheckpointError(UserError):
    """A checkpoint cannot be written, read, verified or applied (one line naming the file)."""


def encode(state: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def decode(payload: bytes) -> dict:
    """Unpickle with ``weights_only``: tensors, containers and numbers only, no code runs.

    Tensors load onto the CPU whatever device wrote them (``map_location="cpu"``: no rank
    touches a GPU that is not its own); ``load_state_dict`` then copies them onto the device the
    run trains on - the model's into its tensors, the optimiser's state cast to each parameter's
    device by ``torch.optim.Optimizer.load_state_dict``. So a checkpoint written on GPUs
    resumes on CPUs and the other way round."""
    return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)


# what Checkpointer.resume reads from a payload; a payload without them is not one of ours
REQUIRED = ("step", "epoch", "step_in_epoch", "world_size", "global_batch", "trainer", "rng", "model_signature")


def load(path: str, payload: bytes) -> dict:
    """:func:`decode` a payload whose digest matched, or :class:`CheckpointError` naming ``path``:
    the digest proves the bytes are the ones written, not that they are a checkpoint this hpctrain
    loads (a payload of another program, or random bytes given a matching header). Never retried
    with ``weights_only=False``: that would run whatever code the file names."""
    try:
        state = decode(payload)
    except Exception as exc:            # torch raises UnpicklingError, RuntimeError, EOFError, ValueError…
        raise CheckpointError(f"checkpoint {path}: digest matches but the payload cannot be loaded safely "
                              f"(torch.load weights_only: {type(exc).__name__})") from None
    missing = [k for k in REQUIRED if k not in state] if isinstance(state, dict) else list(REQUIRED)
    if missing:
        raise CheckpointError(f"checkpoint {path}: digest matches but the payload is not an hpctrain "
                              f"checkpoint (no {', '.join(missing)})")
    return state


def write_file(path: str, payload: bytes, meta: dict) -> dict:
    """Write ``payload`` atomically to ``path`` with a header; returns the header."""
    header = {"format": FORMAT_VERSION, "sha256": hashlib.sha256(payload).hexdigest(),
              "n_bytes": len(payload), **meta}
    half = len(payload) // 2
    with atomic_open(path, "wb") as fh:
        fh.write(MAGIC + json.dumps(header).encode() + b"\n")
        fh.write(payload[:half])
        fh.flush()
        maybe_kill("checkpoint")                   # test hook: die half-way through the write
        fh.write(payload[half:])
    return header


def read_file(path: str, verify: bool = True) -> tuple[dict, bytes]:
    """Header and payload; raises :class:`CheckpointError` if truncated or the checksum fails."""
    try:
        with open(path, "rb") as fh:
            if fh.read(len(MAGIC)) != MAGIC:
                raise CheckpointError(f"checkpoint {path}: not an hpctrain checkpoint")
            try:
                header = json.loads(fh.readline())
            except ValueError:
                raise CheckpointError(f"checkpoint {path}: unreadable header") from None
            if not isinstance(header, dict):
                raise CheckpointError(f"checkpoint {path}: unreadable header")
            payload = fh.read()
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path}: {exc.strerror or exc}") from None
    if header.get("format", 0) > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path}: format {header.get('format')} is newer than this "
                              f"hpctrain reads ({FORMAT_VERSION}); upgrade hpctrain")
    if verify:
        n = header.get("n_bytes")
        if not isinstance(n, int):
            raise CheckpointError(f"checkpoint {path}: unreadable header (no payload length)")
        if len(payload) != n:
            what = "truncated" if len(payload) < n else "size mismatch"
            raise CheckpointError(f"checkpoint {path}: {what} ({len(payload)} bytes, header says {n})")
        if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
            raise CheckpointError(f"checkpoint {path}: SHA-256 mismatch (corrupt)")
    return header, payload


def read_header(path: str) -> dict | None:
    """A checkpoint's header alone (no payload read), or None if it cannot be read."""
    try:
        with open(path, "rb") as fh:
            if fh.read(len(MAGIC)) != MAGIC:
                return None
            header = json.loads(fh.readline())
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) else None


