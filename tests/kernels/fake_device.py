"""A stand-in for CuPy that runs the launchers on host memory (no GPU needed).

The launch path (tables, addresses, allocation, argument order and C types) is exercised for
real; only the kernel body is replaced by a NumPy emulation. Arguments are matched to the
kernel's parameters *by name*, parsed from the CUDA source, and checked against the C types, so
a launcher passing arguments in the wrong order or width fails. The CUDA bodies themselves are
checked by the compile test and, on a GPU, by test_gpu.py.
"""
import ctypes
import re
import types

import numpy as np

from hpctrain.kernels._table import decode_chunk


class FakeArray:
    """Host NumPy array dressed as a CuPy device array."""

    def __init__(self, host):
        host = np.asarray(host)
        self.host = host if host.flags.c_contiguous else host.copy()  # keeps 0-d arrays 0-d
        self.data = types.SimpleNamespace(ptr=self.host.ctypes.data)
        self.device = types.SimpleNamespace(id=0)
        self.shape, self.dtype, self.size = self.host.shape, self.host.dtype, self.host.size
        self.flags = self.host.flags
        self.__cuda_array_interface__ = {"shape": self.shape, "data": (self.data.ptr, False)}


def _view(address, n, dtype):
    dtype = np.dtype(dtype)
    if n == 0:
        return np.zeros(0, dtype)
    raw = (ctypes.c_uint8 * (n * dtype.itemsize)).from_address(int(address))
    return np.frombuffer(raw, dtype=dtype)


def parameters(source, name):
    """[(c_type, param_name)] of `extern "C" __global__ void name(...)` in `source`."""
    signature = re.search(rf"void\s+{name}\s*\(([^)]*)\)", source).group(1)
    params = []
    for part in signature.split(","):
        words = part.replace("*", " * ").split()
        params.append((" ".join(words[:-1]), words[-1]))
    return params


def _check_type(c_type, value, pname):
    if "*" in c_type:
        assert isinstance(value, (FakeArray, np.uint64)), f"{pname}: pointer, got {value!r}"
    elif c_type.endswith("int"):
        assert isinstance(value, np.int32), f"{pname}: int32 expected, got {type(value)}"
    elif c_type.endswith("float"):
        assert isinstance(value, np.float32), f"{pname}: float32 expected, got {type(value)}"
    else:
        raise AssertionError(f"{pname}: unexpected C type {c_type}")


def _addr(value):
    return value.data.ptr if isinstance(value, FakeArray) else int(value)


class FakeKernel:
    def __init__(self, source, name):
        self.params = parameters(source, name)
        self.name = name
        self.launches = 0

    def __call__(self, grid, block, args):
        assert len(args) == len(self.params), f"{self.name}: {len(args)} args for {self.params}"
        for (c_type, pname), value in zip(self.params, args):
            _check_type(c_type, value, pname)
        named = {pname: value for (_, pname), value in zip(self.params, args)}
        self.launches += 1
        EMULATORS[self.name](grid[0], named)


def _chunks(a, n_blocks):
    table = a["table"].host
    n = int(a["n_tensors"])
    for c in range(n_blocks):
        t, begin, end = decode_chunk(table, n, c)
        yield t, begin, end, table, n


def _pack(n_blocks, a):
    for t, begin, end, table, n in _chunks(a, n_blocks):
        src = _view(table[t], end, np.float32)[begin:]
        dst = _view(_addr(a["out"]) + 2 * int(table[n + t]), end, np.float16)[begin:]
        with np.errstate(over="ignore", invalid="ignore"):
            dst[:] = (src * a["scale"]).astype(np.float16)
        if not np.isfinite(dst).all():
            _view(_addr(a["flag"]), 1, np.uint8)[0] = 1


def _unpack(n_blocks, a):
    for t, begin, end, table, n in _chunks(a, n_blocks):
        src = _view(_addr(a["buf"]) + 2 * int(table[n + t]), end, np.float16)[begin:]
        dst = _view(table[t], end, np.float32)[begin:]
        v = src.astype(np.float32) * a["scale"]
        dst[:] = dst + v if a["accumulate"] else v


def _sq_norms(n_blocks, a):
    partial = _view(_addr(a["partial"]), n_blocks, np.float32)
    for c, (t, begin, end, table, n) in enumerate(_chunks(a, n_blocks)):
        v = _view(table[t], end, np.float32)[begin:]
        partial[c] = np.dot(v, v)
    n = int(a["n_tensors"])
    per = _view(_addr(a["per_tensor_sq"]), n, np.float32)
    table = a["table"].host
    for t in range(n):
        count = -(-int(table[2 * n + t]) // 16384)
        first = int(table[3 * n + t])
        per[t] = partial[first:first + count].sum()
    _view(_addr(a["global_norm"]), 1, np.float32)[0] = np.sqrt(per.sum())


def _lars(n_blocks, a):
    for t, begin, end, table, n in _chunks(a, n_blocks):
        w = _view(table[t], end, np.float32)[begin:]
        g = _view(a["grad_addrs"].host[t], end, np.float32)[begin:]
        v = _view(a["mom_addrs"].host[t], end, np.float32)[begin:]
        step_ptr = _addr(a["step"])
        s = _view(step_ptr, n, np.float32)[t] if step_ptr else a["step_scalar"]
        u = s * (g + a["weight_decay"] * w)
        v[:] = a["momentum"] * v + u
        w[:] = w - u - a["momentum"] * v if a["nesterov"] else w - v


EMULATORS = {"hpc_pack_fp16": _pack, "hpc_unpack_fp16": _unpack, "hpc_sq_norms": _sq_norms,
             "hpc_lars_update": _lars}


class _Context:
    id = 0
    ptr = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def fake_cupy():
    """A module-like object with the parts of CuPy the launchers use."""
    kernels_built = []

    def raw_module(code, options=()):
        assert "-std=c++17" in options
        def get_function(name):
            k = FakeKernel(code, name)
            kernels_built.append(k)
            return k
        return types.SimpleNamespace(get_function=get_function)

    cuda = types.SimpleNamespace(Device=lambda dev=None: _Context(),
                                 get_current_stream=lambda: _Context())
    return types.SimpleNamespace(
        cuda=cuda, RawModule=raw_module, kernels_built=kernels_built,
        asarray=lambda host: FakeArray(np.array(host)),
        zeros=lambda shape, dtype: FakeArray(np.zeros(shape, dtype)),
    )
