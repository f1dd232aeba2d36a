"""What a run shows on the console: the start-up line (topology, device, gradient sync, lr) and
the progress bar's loss."""
from __future__ import annotations

import torch

from hpctrain import kernels
from hpctrain.job.state import Job


def startup_line(job: Job) -> str:
    """What this run chose and why, in one line: topology, device, gradient sync, effective lr."""
    return (f"hpctrain: {job.topo.describe()} | device {describe_device(job.device, job.options.device)} | "
            f"sync {job.trainer.grad_sync.describe()} | "
            f"{job.lr_line}")


def show_progress(bar, loss_acc: torch.Tensor, lr: float | None) -> None:
    """One step on the progress bar; the mean loss is read (a host sync on a GPU: the host
    waits for the step's kernels) only when tqdm redraws, a few times a second, not every
    step. ``tqdm.update`` returns True when it redrew."""
    if bar.update(1):
        loss_sum, n = loss_acc.tolist()
        bar.set_postfix(loss=f"{loss_sum / max(n, 1):.3f}", lr=f"{lr:.3g}")


def describe_device(device: torch.device, want: str) -> str:
    """``cuda:1 (auto: local rank mod 2 visible GPUs)``, ``cpu (auto: no CUDA device)``, ``cpu``."""
    if device.type == "cuda":
        return (f"{device} ({want}: local rank mod {torch.cuda.device_count()} visible GPU(s); "
                f"kernels: {kernels.backend()[1]})")
    return f"{device} (auto: no CUDA device)" if want == "auto" else str(device)
