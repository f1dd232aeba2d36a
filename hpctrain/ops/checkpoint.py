"""Checkpoints: atomic, checksummed, resumable on the same or another number of ranks.

File ``DIR/ckpt-000001234.pt`` (step 1234; ``-leg<L>`` added from a run's second leg on) = a
magic line, a one-line JSON header (format version, SHA-256 and length of the payload, step,
epoch, world size, run id, leg, samples seen: :mod:`~hpctrain.ops.ckptfile`) and the payload, a
``torch.save`` of: the trainer's state (model, optimiser, algorithm state such as the loss
scaler, step), the data position (epoch, step in epoch, samples seen, global batch), every
rank's RNG state (torch, NumPy, Python; gathered to rank 0), the config and the model's
signature. ``torch.save`` rather than HDF5 because optimiser state is a nested dict of tensors
and numbers; rank 0 alone writes, since parameters are identical on every rank after a step.

Atomicity (the POSIX rename idiom, :mod:`hpctrain.ops.fileio`): write ``.ckpt-….pt.tmp-PID``, fsync,
rename over the final name, fsync the directory — a job killed mid-write leaves only a stray
temporary file; the previous checkpoints are untouched and still verify. The ``keep`` holding
the newest work are kept (:mod:`~hpctrain.ops.ckptdir`: ordered by leg and samples seen, not by
step). ``resume="auto"`` takes the newest work whose checksum verifies and whose payload loads, setting any other
aside as ``*.corrupt`` with a warning, and refuses (status 2) when none of the run's verifies.
Rank 0 reads and verifies; the bytes are broadcast, so thousands of ranks do not all open the file.
"""
from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass

import numpy as np
import torch
from mpi4py import MPI

from hpctrain.models.ghostbn import rank_dependent_norm
from hpctrain.ops.agree import first_difference, model_signature
from hpctrain.ops.ckptdir import (
    checkpoint_name,
    corrupt_files,
    list_checkpoints,
    newest_valid,
    newest_work,
    of_run,
    prune,
)
from hpctrain.ops.ckptfile import (
    FORMAT_VERSION,
    MAGIC,
    CheckpointError,
    decode,
    encode,
    load,
    read_file,
    read_header,
    write_file,
)
from hpctrain.ops.metrics import NULL_TIMER, Timer

__all__ = ["BCAST_CHUNK_BYTES", "CheckpointError", "Checkpointer", "FORMAT_VERSION", "MAGIC", "Position",
           "checkpoint_name", "corrupt_files", "decode", "encode", "list_checkpoints",
           "load", "newest_work", "newest_valid",
           "of_run", "prune", "read_file", "read_header", "replan", "resume_spec", "rng_state", "set_rng_state",
           "write_file"]

BCAST_CHUNK_BYTES = 1 << 28        # stay far below MPI's 2**31 element count limit


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


def resume_spec(value: str) -> str:
    """``ckpt.resume`` as the checkpointer takes it: ``none`` (or empty) is a fresh start, ''."""
    return "" if value.strip().lower() in ("", "none") else value


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
                 run_id: str | None = None, lanes: int = 0):
        self.comm, self.directory, self.run_id = comm, directory, run_id
        self.lanes = lanes          # the data plan's lanes (loader.lanes): fixed, the plan at any rank count
        self.steps_per_epoch, self.global_batch = steps_per_epoch, global_batch
        self.config, self.every_steps, self.keep, self.timer = config, every_steps, keep, timer
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.last_step: int | None = None            # step of the last checkpoint written or loaded
        self.last_path: str | None = None
        # the work so far: this leg of the run (ckptdir), and the samples seen when it began at base_step
        self.leg, self.base_step, self.base_samples = 0, 0, 0
        self._loaded: dict | None = None              # rank 0: the state it decoded while choosing

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
            path, error = os.path.join(self.directory, checkpoint_name(step, self.leg)), None
            if self.rank == 0:
                epoch, sie = divmod(step, self.steps_per_epoch)
                meta = {"step": step, "epoch": epoch, "step_in_epoch": sie, "world_size": self.size,
                        "leg": self.leg, "global_batch": self.global_batch, "lanes": self.lanes,
                        "samples_seen": self.base_samples + (step - self.base_step) * self.global_batch}
                if self.run_id:
                    meta["run_id"] = self.run_id
                state = {**meta, "format": FORMAT_VERSION, "steps_per_epoch": self.steps_per_epoch,
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

    def _fetch(self, spec: str) -> tuple[str | None, bytes | None, tuple[int, str] | None]:
        """Rank 0 finds and verifies; everyone gets (path, payload) or (None, None), and the leg and
        path of this run's newest work in the directory (:func:`~hpctrain.ops.ckptdir.newest_work`)."""
        path: str | None = None
        payload: bytes | None = None
        error: str | None = None
        newest: tuple[int, str] | None = None
        if self.rank == 0:
            def check(p: str, data: bytes) -> None:      # decoded once, here: one that cannot be is set aside
                self._loaded = load(p, data)
            try:
                if spec == "auto":
                    found = newest_valid(self.directory, warn=lambda m: self._say(f"warning: {m}"),
                                         run_id=self.run_id, check=check)
                    if found is None:
                        self._say(f"no valid checkpoint in {self.directory}: starting from scratch")
                    else:
                        path, _, payload = found
                else:
                    path = spec
                    _, payload = read_file(spec)
                    check(spec, payload)
            except CheckpointError as exc:
                error = str(exc)
            newest = newest_work(self.directory, self.run_id)     # after any corrupt one was set aside
        path, n, error, newest = self.comm.bcast((path, None if payload is None else len(payload), error, newest),
                                                 root=0)
        if error:
            raise CheckpointError(error)
        if n is None:
            return None, None, newest
        if self.rank == 0:
            assert payload is not None      # n is its length
            buf = np.frombuffer(payload, np.uint8).copy()
        else:
            buf = np.empty(n, np.uint8)
        for lo in range(0, n, BCAST_CHUNK_BYTES):
            self.comm.Bcast(buf[lo:lo + BCAST_CHUNK_BYTES], root=0)
        return path, buf.tobytes(), newest

    def resume(self, trainer, spec: str) -> Position | None:
        """Load ``spec`` ('auto', a path, or '' for none) into ``trainer``; the position to continue at."""
        spec = resume_spec(spec)
        if not spec:
            return None
        path, payload, newest = self._fetch(spec)
        if payload is None:
            return None
        state, self._loaded = self._loaded or load(str(path), payload), None
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
        self._continue_work(path, state, pos, newest, rank_dependent_norm(trainer.model))
        if state["world_size"] == self.size:
            set_rng_state(state["rng"][self.rank])
        elif self.rank < len(state["rng"]):
            set_rng_state(state["rng"][self.rank])
        self._say(f"resumed from {path}: step {pos.step}, epoch {pos.epoch}, "
                  f"step {pos.step_in_epoch} of {self.steps_per_epoch} in the epoch")
        self.last_step, self.last_path = pos.step, path
        return pos

    def _continue_work(self, path: str | None, state: dict, pos: Position, newest: tuple[int, str] | None,
                       per_rank_norm: bool = True) -> None:
        """This run's leg and samples seen from the checkpoint resumed (:mod:`~hpctrain.ops.ckptdir`):
        the same leg when the run goes on unchanged and it holds the run's newest work here; else a
        new leg after the newest (a resume from older work branches: it must not write over, nor
        rank below, what came after it). Another rank count goes on unchanged when the global batch
        and the plan's lanes are the same and no layer normalises by the local batch
        (``per_rank_norm``: a plain BatchNorm); said in one line on rank 0 when the run changed."""
        leg = state.get("leg", 0)
        old_batch, old_size = state["global_batch"], state["world_size"]
        same_plan = old_size == self.size or (state.get("lanes") == self.lanes and not per_rank_norm)
        changed = old_batch != self.global_batch or not same_plan
        is_newest = newest is None or (path is not None and os.path.abspath(path) == newest[1])
        top = leg if newest is None else newest[0]
        self.leg = leg if not changed and is_newest else top + 1
        self.base_step = pos.step
        self.base_samples = state.get("samples_seen", state["step"] * old_batch)
        if changed:
            ranks = (f"; checkpoint {path} is from {old_size} ranks, this run has {self.size}: per-rank RNG "
                     f"streams restart" if old_size != self.size else "")
            if old_batch == self.global_batch:     # the rank count alone: the plan or BatchNorm depends on it
                ranks += (f" (the same run at any rank count needs data.lanes fixed, here {state.get('lanes')} -> "
                          f"{self.lanes}, and model.bn_group set for BatchNorm: docs/data.md)")
            self._say(f"warning: resume changes the global batch {old_batch} -> {self.global_batch} "
                      f"({old_size} -> {self.size} ranks): leg {self.leg} of this run, its checkpoints "
                      f"named -leg{self.leg} rank after leg {top}'s; the rest of epoch {pos.epoch} follows this "
                      f"run's data plan (step {pos.step_in_epoch} of {self.steps_per_epoch}){ranks}")
        elif old_size != self.size:
            self._say(f"note: {path} is from {old_size} ranks, this run has {self.size}: the same run goes on "
                      f"(global batch {self.global_batch}, {self.lanes} data lanes, no per-rank BatchNorm)")
        if not changed and self.leg != leg:
            self._say(f"note: {path} is not this run's newest work ({newest[1] if newest else '?'}): continuing "
                      f"as leg {self.leg}, ranked after it")
