"""What the GPU tests expect of a gradient sync's start-up line, in one place that imports no MPI.

``tests/mpi/test_gpu_sync.py`` (GPU only) asserts these lines on a GPU; ``tests/unit/test_gpu_expect.py``
checks them against :meth:`hpctrain.comm.base.GradSync.describe` on the CPU (``meta`` tensors
stand in for device buffers), so an expectation that the code does not meet fails in CI, not
first on a GPU node (issue 34, N1: the ``-n 1`` leg expected "handed to MPI", but one rank
keeps its buckets on the device and never hands them to MPI).
"""


def direct_route_text(n_ranks: int, device) -> str:
    """The describe() fragment of device buckets that are not staged: one rank keeps them on
    the device (nothing crosses to another rank); several ranks hand them to a CUDA-aware MPI."""
    if n_ranks == 1:
        return f"kept on {device} (one rank: no copies)"
    return f"handed to MPI on {device}"
