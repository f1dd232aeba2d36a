"""Checkpoints: atomic, checksummed, resumable on the same or another number of ranks.

File ``DIR/ckpt-000001234.pt`` (step 1234) = a magic line, a one-line JSON header (format
version, SHA-256 and length of the payload, step, epoch, world size) and the payload, a
``torch.save`` of: the trainer's state (model, optimiser, algorithm state such as the loss
scaler, step), the data position (epoch, step in epoch, samples seen, global batch), every
rank's RNG state (torch, NumPy, Python; gathered to rank 0), the config and the model's
signature. ``torch.save`` rather than HDF5 because optimiser state is a nested dict of tensors
and numbers; rank 0 alone writes, since parameters are identical on every rank after a step.

Atomicity (the POSIX rename idiom, :mod:`hpctrain.fileio`): write ``.ckpt-….pt.tmp-PID``, fsync,
rename over the final name, fsync the directory — a job killed mid-write leaves only a stray
temporary file; the previous checkpoints are untouched and still verify. The newest ``keep`` are kept.
``resume="auto"`` takes the newest checkpoint whose checksum verifies, falling back past a
corrupt one with a warning. Rank 0 reads and verifies; the bytes are broadcast, so thousands of
ranks do not all open the file.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import sys
from dataclasses import dataclass

import numpy as np
import torch
from mpi4py import MPI

from hpctrain.errors import UserError
from hpctrain.fileio import atomic_open
from hpctrain.ops.agree import first_difference, model_signature
from hpctrain.testhooks import maybe_kill
from hpctrain.ops.metrics import NULL_TIMER, Timer

FORMAT_VERSION = 1
MAGIC = b"HPCTRAIN-CHECKPOINT\n"
NAME_RE = re.compile(r"^ckpt-(\d+)\.pt$")
BCAST_CHUNK_BYTES = 1 << 28        # stay far below MPI's 2**31 element count limit


class CheckpointError(UserError):
    """A checkpoint cannot be written, read, verified or applied (one line naming the file)."""


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:09d}.pt"


# --- the file ------------------------------------------------------------------------------------

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
            payload = fh.read()
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path}: {exc.strerror or exc}") from None
    if header.get("format", 0) > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path}: format {header.get('format')} is newer than this "
                              f"hpctrain reads ({FORMAT_VERSION}); upgrade hpctrain")
    if verify:
        n = header.get("n_bytes")
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
            return json.loads(fh.readline())
    except (OSError, ValueError):
        return None


def of_run(path: str, run_id: str | None) -> bool:
    """Whether the checkpoint at ``path`` belongs to run ``run_id`` (None: any run). A checkpoint
    whose header cannot be read, or written before checkpoints carried a run id, counts as this
    run's (reading it then verifies it, or warns)."""
    if run_id is None:
        return True
    header = read_header(path)
    return header is None or header.get("run_id") in (None, run_id)


def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """``(step, path)`` of every checkpoint in ``directory``, oldest first."""
    if not os.path.isdir(directory):
        return []
    found = [(int(m.group(1)), os.path.join(directory, name))
             for name in os.listdir(directory) if (m := NAME_RE.match(name))]
    return sorted(found)


def newest_valid(directory: str, warn=None, run_id: str | None = None) -> tuple[str, dict, bytes] | None:
    """The newest checkpoint of run ``run_id`` (None: any) that verifies (``warn(msg)`` for each
    one skipped), or None. Raises :class:`CheckpointError` if there is none of this run's but there
    are another run's: continuing from those would be another run's weights."""
    foreign = None
    for _, path in reversed(list_checkpoints(directory)):
        if not of_run(path, run_id):
            foreign = foreign or path
            continue
        try:
            header, payload = read_file(path)
            return path, header, payload
        except CheckpointError as exc:
            if warn:
                warn(f"{exc}; falling back to the previous checkpoint")
    if foreign:
        other = (read_header(foreign) or {}).get("run_id")    # None: gone or unreadable since of_run
        who = f"run {other}" if other else "another run"
        raise CheckpointError(f"checkpoint {foreign} belongs to {who}, not to "
                              f"this run ({run_id}) and this run has none: resume it by path "
                              f"(--resume {foreign}) or start afresh (--resume none)")
    return None


def prune(directory: str, keep: int, run_id: str | None = None) -> list[str]:
    """Delete all but the newest ``keep`` checkpoints of run ``run_id`` (None: any run; another
    run's are never deleted) and stray temporary files; returns deleted paths."""
    doomed = [p for _, p in list_checkpoints(directory) if of_run(p, run_id)][:-keep]
    doomed += [os.path.join(directory, n) for n in os.listdir(directory) if n.startswith(".ckpt-") and ".tmp-" in n]
    for p in doomed:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    return doomed


# --- what is saved besides the trainer -------------------------------------------------------

def rng_state() -> dict:
    """This process's generators in a ``weights_only``-loadable form."""
    legacy = np.random.get_state(legacy=True)
    assert isinstance(legacy, tuple)        # legacy=True: a tuple (its stub also allows the dict form)
    name, keys, pos, has_gauss, gauss = legacy
    return {"torch": torch.get_rng_state(), "numpy": [name, keys.tolist(), pos, has_gauss, gauss],
            "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


@dataclass(frozen=True)
class Position:
    """Where training continues: the schedule step and the data plan's (epoch, step in epoch)."""
    step: int
    epoch: int
    step_in_epoch: int
    replanned: bool = False


def replan(epoch: int, step_in_epoch: int, old_global_batch: int, steps_per_epoch: int,
           global_batch: int) -> Position:
    """Continue ``epoch`` after the same number of samples with a new global batch / plan.

    The epoch is kept; the step in the epoch is recomputed from the samples seen in it (rounded
    down, so at most one batch of samples is seen twice); the schedule step follows.
    """
    sie = step_in_epoch * old_global_batch // global_batch
    if sie >= steps_per_epoch:
        epoch, sie = epoch + 1, 0
    return Position(epoch * steps_per_epoch + sie, epoch, sie,
                    replanned=(old_global_batch != global_batch))


# --- collective save / resume ------------------------------------------------------------------

class Checkpointer:
    """Periodic, final and signal checkpoints of one run, and resume. Collective methods.

    ``steps_per_epoch`` and ``global_batch`` describe the current data plan: the data position
    is ``divmod(step, steps_per_epoch)`` because every epoch has exactly that many steps.
    """

    def __init__(self, comm: MPI.Comm, directory: str, *, steps_per_epoch: int, global_batch: int,
                 config: dict, every_steps: int = 0, keep: int = 3, timer: Timer = NULL_TIMER,
                 run_id: str | None = None):
        self.comm, self.directory, self.run_id = comm, directory, run_id
        self.steps_per_epoch, self.global_batch = steps_per_epoch, global_batch
        self.config, self.every_steps, self.keep, self.timer = config, every_steps, keep, timer
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.last_step: int | None = None            # step of the last checkpoint written or loaded
        self.last_path: str | None = None

    @classmethod
    def from_config(cls, cfg, comm: MPI.Comm, loader, timer: Timer = NULL_TIMER,
                    run_id: str | None = None) -> Checkpointer:
        directory = cfg.ckpt.dir or os.path.join(cfg.run.run_dir, "checkpoints")
        return cls(comm, directory, steps_per_epoch=loader.steps, global_batch=loader.global_batch,
                   config=cfg.to_dict(), every_steps=cfg.ckpt.every_steps, keep=cfg.ckpt.keep, timer=timer,
                   run_id=run_id)

    def _say(self, text: str) -> None:
        if self.rank == 0:
            print(f"hpctrain: {text}", file=sys.stderr, flush=True)

    def due(self, step: int) -> bool:
        return bool(self.every_steps) and step % self.every_steps == 0 and step != self.last_step

    def save(self, trainer) -> str:
        """Write a checkpoint of ``trainer`` now (skipped if this step is already saved).

        Completes any update still in flight first (OD-SGD's delayed global step, via
        ``trainer.finish()``), so a checkpoint is a synchronisation point of the algorithm.
        """
        step = trainer.step_count
        if step == self.last_step:
            assert self.last_path is not None       # set together with last_step
            return self.last_path
        with self.timer.span("checkpoint"):
            trainer.finish()
            rngs = self.comm.gather(rng_state(), root=0)
            path, error = os.path.join(self.directory, checkpoint_name(step)), None
            if self.rank == 0:
                epoch, sie = divmod(step, self.steps_per_epoch)
                meta = {"step": step, "epoch": epoch, "step_in_epoch": sie, "world_size": self.size}
                if self.run_id:
                    meta["run_id"] = self.run_id
                state = {**meta, "format": FORMAT_VERSION, "samples_seen": step * self.global_batch,
                         "global_batch": self.global_batch, "steps_per_epoch": self.steps_per_epoch,
                         "trainer": trainer.state_dict(), "rng": rngs, "config": self.config,
                         "model_signature": model_signature(trainer.model)}
                try:
                    write_file(path, encode(state), meta)
                    prune(self.directory, self.keep, self.run_id)
                except OSError as exc:
                    error = f"checkpoint {path}: cannot write: {exc.strerror or exc}"
            error = self.comm.bcast(error, root=0)
        if error:
            raise CheckpointError(error)
        self.last_step, self.last_path = step, path
        return path

    def _fetch(self, spec: str) -> tuple[str | None, bytes | None]:
        """Rank 0 finds and verifies; everyone gets (path, payload) or (None, None)."""
        path: str | None = None
        payload: bytes | None = None
        error: str | None = None
        if self.rank == 0:
            try:
                if spec == "auto":
                    found = newest_valid(self.directory, warn=lambda m: self._say(f"warning: {m}"),
                                         run_id=self.run_id)
                    if found is None:
                        self._say(f"no valid checkpoint in {self.directory}: starting from scratch")
                    else:
                        path, _, payload = found
                else:
                    path = spec
                    _, payload = read_file(spec)
            except CheckpointError as exc:
                error = str(exc)
        path, n, error = self.comm.bcast((path, None if payload is None else len(payload), error), root=0)
        if error:
            raise CheckpointError(error)
        if n is None:
            return None, None
        if self.rank == 0:
            assert payload is not None      # n is its length
            buf = np.frombuffer(payload, np.uint8).copy()
        else:
            buf = np.empty(n, np.uint8)
        for lo in range(0, n, BCAST_CHUNK_BYTES):
            self.comm.Bcast(buf[lo:lo + BCAST_CHUNK_BYTES], root=0)
        return path, buf.tobytes()

    def resume(self, trainer, spec: str) -> Position | None:
        """Load ``spec`` ('auto', a path, or '' for none) into ``trainer``; the position to continue at."""
        if not spec:
            return None
        path, payload = self._fetch(spec)
        if payload is None:
            return None
        state = decode(payload)
        sig = model_signature(trainer.model)
        if state["model_signature"] != sig:
            raise CheckpointError(f"checkpoint {path} was written for a different model: this run has "
                                  f"{first_difference(state['model_signature'], sig)}")
        try:
            trainer.load_state_dict(state["trainer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {path} does not fit this run: {str(exc).splitlines()[0]}") from None
        pos = replan(state["epoch"], state["step_in_epoch"], state["global_batch"], self.steps_per_epoch,
                     self.global_batch)
        trainer.step_count = pos.step
        if state["world_size"] == self.size:
            set_rng_state(state["rng"][self.rank])
        else:
            self._say(f"warning: checkpoint {path} is from {state['world_size']} ranks, this run has "
                      f"{self.size}: the rest of epoch {pos.epoch} follows this run's data plan "
                      f"(step {pos.step_in_epoch} of {self.steps_per_epoch}); per-rank RNG streams restart")
            if self.rank < len(state["rng"]):
                set_rng_state(state["rng"][self.rank])
        self._say(f"resumed from {path}: step {pos.step}, epoch {pos.epoch}, "
                  f"step {pos.step_in_epoch} of {self.steps_per_epoch} in the epoch")
        self.last_step, self.last_path = pos.step, path
        return pos
