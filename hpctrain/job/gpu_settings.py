"""The GPU settings a training job applies from ``[train]``: cuDNN's autotuner, TF32 matmuls.

``train.cudnn_benchmark`` (default on): cuDNN times its convolution algorithms for each new
input shape once and keeps the fastest; a job's shapes are fixed (only the last batch of an
evaluation differs), so this pays after a few steps. Runs are then not bitwise reproducible
from one run to the next on a GPU (the chosen algorithm may differ).
``train.tf32`` (default off, torch's default): fp32 matrix multiplications on Ampere and newer
GPUs use TensorFloat-32 (10-bit mantissa, several times the throughput). cuDNN convolutions
follow torch's own default (TF32 allowed) either way. Both are process-wide torch flags with
no effect on the CPU. ``train.channels_last`` is applied to the model by the job
(:func:`model_memory_format`).
"""
from __future__ import annotations

import torch


def apply(*, cudnn_benchmark: bool, tf32: bool, backends=torch.backends) -> dict:
    """Set the process-wide flags (``train.cudnn_benchmark``, ``train.tf32``); returns what was set."""
    backends.cudnn.benchmark = bool(cudnn_benchmark)
    backends.cuda.matmul.allow_tf32 = bool(tf32)
    return {"cudnn.benchmark": backends.cudnn.benchmark, "cuda.matmul.allow_tf32": backends.cuda.matmul.allow_tf32}


def model_memory_format(model: torch.nn.Module, channels_last: bool) -> torch.nn.Module:
    """``model`` in channels-last layout (NHWC: what tensor cores' convolutions read without a
    transpose) where asked; convolutions then give channels-last outputs from NCHW inputs too."""
    if not channels_last:
        return model
    return model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch stub omits it
