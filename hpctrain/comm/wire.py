"""A bucket's wire: which of its values cross between ranks, in which format, packed by whom.

Every bucket has exactly one, made with it by :func:`hpctrain.comm.buckets.make_buckets` and
never replaced. The strategy says how far it reaches (:meth:`hpctrain.comm.base.GradSync._wire`:
``flat`` the whole bucket among all ranks, ``hierarchical`` this rank's slice among the nodes),
:func:`hpctrain.comm.compression.wire_codec` which codec that size and rank count call for.
A wire over the whole bucket (:attr:`Wire.packs_bucket`) has the gradients packed straight into
it when a round starts and the mean unpacked from it when read (:class:`~hpctrain.comm.buckets.Bucket`
does both); a slice wire is packed and unpacked by its strategy. This is the one place that
calls a codec's ``pack``/``unpack``.
"""
from __future__ import annotations

import torch

from hpctrain.comm.compression import Codec, NoCompression, wire_codec

__all__ = ["Wire"]


class Wire:
    """``codec`` and, where it compresses, ``buf``: the host buffer MPI moves (None: the values
    travel in the bucket's own buffers). ``whole``: the wire carries the whole bucket."""

    __slots__ = ("codec", "buf", "whole")

    def __init__(self, codec: Codec | None = None, buf: torch.Tensor | None = None, whole: bool = False):
        self.codec = codec if codec is not None else NoCompression()
        self.buf, self.whole = buf, whole

    @classmethod
    def sized(cls, codec: Codec, n_elems: int, dtype: torch.dtype, n_ranks: int, whole: bool) -> Wire:
        """The wire for ``n_elems`` values of ``dtype`` among ``n_ranks``: ``codec`` with a buffer
        where it is worth compressing (:func:`~hpctrain.comm.compression.wire_codec`), else
        full precision without one."""
        chosen = wire_codec(codec, n_elems * dtype.itemsize, n_ranks)
        return cls(chosen, chosen.wire_buffer(n_elems, dtype) if chosen.compresses else None, whole)

    @property
    def packs_bucket(self) -> bool:
        """Are the bucket's gradients packed into this wire instead of copied into its input?"""
        return self.whole and self.buf is not None

    def stage(self, staging) -> None:
        """A staged bucket's whole wire: the host buffer becomes one the device copies into
        (pinned on CUDA) and the device wire is made beside it (:meth:`Staging.host_wire`)."""
        if self.packs_bucket:
            self.buf = staging.host_wire(self.buf)

    def pack(self, tensors, scale: float = 1.0, into: torch.Tensor | None = None) -> None:
        """``scale * tensors`` into the wire buffer (or ``into``: a device wire)."""
        out = self.buf if into is None else into
        assert out is not None, "pack: a wire without a buffer"
        self.codec.pack(tensors, out, scale)

    def unpack(self, tensors, source: torch.Tensor | None = None) -> None:
        """The wire buffer (or ``source``: a device wire) into ``tensors``."""
        src = self.buf if source is None else source
        assert src is not None, "unpack: a wire without a buffer"
        self.codec.unpack(src, tensors)
