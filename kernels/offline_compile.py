"""Compile the CUDA sources without a GPU, treating every warning as an error.

NVRTC comes with the CUDA extras (`hpctrain[cuda]` for CUDA 12, `hpctrain[cuda13]` for 13) and
compiles for any architecture without a device through CuPy's low-level bindings
(`cupy.cuda.compiler.compile_using_nvrtc` queries the device, so it is not used). `nvcc` is the
fallback. Run `python -m hpctrain.kernels.offline_compile` for a table of every kernel x target.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

TARGETS = ("compute_70", "compute_80", "compute_90", "sm_80", "sm_90")
"""PTX for V100/A100/H100 and cubins for A100/H100."""

BENIGN_LOG_LINES = (
    # NVRTC 12.9 deprecates compute_70 with this message even for a perfect source.
    "nvrtc: warning: Architectures prior to '<compute/sm>_75' are deprecated and may be removed "
    "in a future release",
)


class CompileError(RuntimeError):
    """A source failed to compile or compiled with warnings; `log` holds the compiler output."""

    def __init__(self, message, log) -> None:
        super().__init__(f"{message}\n{log}")
        self.log = log


def significant_log(log) -> str:
    """The compiler log without blank and known-benign lines: non-empty means failure."""
    lines = [ln for ln in log.splitlines() if ln.strip() and ln.strip() not in BENIGN_LOG_LINES]
    return "\n".join(lines)


def nvrtc_status() -> tuple[Any, str]:
    """`(nvrtc module or None, reason)`."""
    try:
        from cupy.cuda import nvrtc
        version = nvrtc.getVersion()
    except ImportError:
        return None, ("cupy not installed (pip install 'hpctrain[cuda]' for CUDA 12, "
                      "'hpctrain[cuda13]' for CUDA 13)")
    except Exception as exc:  # missing libnvrtc raises from getVersion; reported, not hidden
        return None, f"NVRTC not loadable: {type(exc).__name__}: {exc}"
    return nvrtc, f"NVRTC {version[0]}.{version[1]}"


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


def compile_nvrtc(source, name, target) -> bytes:
    """PTX (compute_XX) or cubin (sm_XX) bytes; CompileError on any error or warning."""
    nvrtc, reason = nvrtc_status()
    if nvrtc is None:
        raise RuntimeError(reason)
    prog = nvrtc.createProgram(source, f"{name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [f"-arch={target}", "-std=c++17"])
        except nvrtc.NVRTCError as exc:
            raise CompileError(f"NVRTC failed on {name} for {target}: {exc}",
                               nvrtc.getProgramLog(prog)) from None
        log = significant_log(nvrtc.getProgramLog(prog))
        if log:
            raise CompileError(f"NVRTC warned on {name} for {target}", log)
        return nvrtc.getCUBIN(prog) if target.startswith("sm_") else nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)


def nvcc_targets(nvcc) -> set[str]:
    """Targets this nvcc accepts (CUDA 13 dropped compute_70)."""
    found = set()
    for flag in ("--list-gpu-arch", "--list-gpu-code"):
        run = subprocess.run([nvcc, flag], capture_output=True, text=True, check=False)
        found.update(run.stdout.split())
    return found


def compile_nvcc(source, name, target, nvcc=None) -> bytes:
    """Same contract as `compile_nvrtc`, through `nvcc -Werror all-warnings`."""
    nvcc = nvcc or nvcc_path()
    if nvcc is None:
        raise RuntimeError("nvcc not found on PATH")
    kind = "-cubin" if target.startswith("sm_") else "--ptx"
    with tempfile.TemporaryDirectory() as tmp:
        src_path = os.path.join(tmp, f"{name}.cu")
        out_path = os.path.join(tmp, f"{name}.out")
        with open(src_path, "w") as fh:
            fh.write(source)
        run = subprocess.run([nvcc, "-std=c++17", f"-arch={target}", kind, "-Werror",
                              "all-warnings", "-o", out_path, src_path],
                             capture_output=True, text=True, check=False)
        log = significant_log(run.stdout + run.stderr)
        if run.returncode != 0 or log:
            raise CompileError(f"nvcc failed on {name} for {target} (exit {run.returncode})", log)
        with open(out_path, "rb") as fh:
            return fh.read()


def main(argv=None) -> int:
    """Compile every kernel for every target; exit 1 if any fails."""
    parser = argparse.ArgumentParser(prog="python -m hpctrain.kernels.offline_compile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--compiler", choices=("auto", "nvrtc", "nvcc"), default="auto")
    args = parser.parse_args(argv)
    from . import SOURCES

    nvrtc, reason = nvrtc_status()
    use_nvrtc = args.compiler == "nvrtc" or (args.compiler == "auto" and nvrtc is not None)
    if not use_nvrtc and nvcc_path() is None:
        print(f"no CUDA compiler: {reason}; nvcc not on PATH", file=sys.stderr)
        return 2
    compile_fn = compile_nvrtc if use_nvrtc else compile_nvcc
    allowed = set(TARGETS) if use_nvrtc else nvcc_targets(nvcc_path())
    print(f"compiler: {reason if use_nvrtc else nvcc_path()}")
    failures = 0
    for name, source in SOURCES.items():
        for target in TARGETS:
            if target not in allowed:
                print(f"{name:18s} {target:11s} skipped (compiler does not support it)")
                continue
            try:
                n_bytes = len(compile_fn(source, name, target))
                print(f"{name:18s} {target:11s} ok ({n_bytes} bytes)")
            except CompileError as exc:
                failures += 1
                print(f"{name:18s} {target:11s} FAILED\n{exc.log}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
