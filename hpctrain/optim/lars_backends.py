"""Where LARS's per-layer norms and its update run: the CuPy kernels or ``torch._foreach``.

The kernels (``kernels.multi_tensor_sq_norms``, ``kernels.lars_update``) run one launch per group
on a GPU with CuPy; without CuPy, their torch reference on a GPU would be slower than
``torch._foreach`` (one dot product per tensor, a copy of every channels_last weight), so the
choice is made here, once, and its reason is kept in a description (``LARS.norms_backend``,
``LARS.update_backend``) rather than hidden.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from hpctrain.kernels._args import is_dense as dense

NormsFn = Callable[[list[torch.Tensor]], torch.Tensor]

__all__ = ["NormsFn", "resolve_norms_fn", "resolve_update_fn"]


def _foreach_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(torch._foreach_norm(tensors))


def _kernels_on_device() -> bool:
    """Do device tensors run the CuPy kernels (else the kernels' torch reference would run)?"""
    from hpctrain import kernels
    return kernels.backend()[0] == "cuda"


def _kernels_norms(fn, on_device: Callable[[], bool] = _kernels_on_device) -> NormsFn:
    """Adapt ``kernels.multi_tensor_sq_norms`` (fp32 only) to ``NormsFn``; other dtypes,
    non-dense tensors, and device tensors where CuPy cannot run the kernel go to
    ``torch._foreach_norm`` (the kernel's reference there would be one dot product per tensor
    and a copy of every channels_last weight). ``norms.ran`` says which ran last."""
    def norms(tensors: list[torch.Tensor]) -> torch.Tensor:
        on_cpu = tensors[0].device.type == "cpu"
        if not all(t.dtype == torch.float32 and dense(t) for t in tensors) or not (on_cpu or on_device()):
            norms.ran = "torch._foreach_norm"   # type: ignore[attr-defined]
            return _foreach_norms(tensors)
        norms.ran = "kernels.multi_tensor_sq_norms"     # type: ignore[attr-defined]
        per_tensor_sq, _global_norm = fn(tensors)
        if isinstance(per_tensor_sq, (list, tuple)):
            per_tensor_sq = torch.stack([torch.as_tensor(x, dtype=tensors[0].dtype)
                                         for x in per_tensor_sq])
        return torch.as_tensor(per_tensor_sq, device=tensors[0].device).sqrt()
    return norms


def resolve_norms_fn(prefer_kernels: bool = True) -> tuple[NormsFn, str]:
    """Pick the multi-tensor L2-norm routine: ``(fn, description)``.

    ``kernels.multi_tensor_sq_norms(tensors) -> (per_tensor_sq, global_norm)`` is used for
    contiguous fp32 tensors when the ``kernels`` package is importable (one CUDA launch on a
    GPU; on the CPU its reference is also more accurate than ``torch._foreach_norm``, whose
    fp32 accumulation was off by 4e-5 relative on ResNet-50 tensors); everything else uses
    ``torch._foreach_norm``. The reason for a fall-back is part of the description (visible
    in ``LARS.norms_backend``), not hidden.
    """
    if prefer_kernels:
        try:
            from hpctrain.kernels import multi_tensor_sq_norms
        except ImportError as exc:
            return _foreach_norms, f"torch._foreach_norm (kernels not used: {exc})"
        return (_kernels_norms(multi_tensor_sq_norms),
                "kernels.multi_tensor_sq_norms for fp32 CPU tensors and CUDA tensors with CuPy, "
                "else torch._foreach_norm")
    return _foreach_norms, "torch._foreach_norm"


def resolve_update_fn(fused_update: bool | None) -> tuple[Callable | None, str]:
    """``(kernels.lars_update or None, description)``: None where ``fused_update`` is False,
    the ``kernels`` package does not import, or (``fused_update`` None) CuPy cannot run it on a
    GPU - a torch reference on the GPU would be no better than the ``_foreach`` path."""
    if fused_update is False:
        return None, "torch._foreach (fused_update=False)"
    try:
        from hpctrain import kernels
    except ImportError as exc:
        return None, f"torch._foreach (kernels not used: {exc})"
    if fused_update is None:
        where, why = kernels.backend()
        if where != "cuda":
            return None, f"torch._foreach on CPU tensors; CUDA tensors too ({why})"
    return kernels.lars_update, "kernels.lars_update for contiguous fp32 CUDA tensors, else torch._foreach"
