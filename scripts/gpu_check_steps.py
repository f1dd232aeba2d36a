"""The measuring steps of ``scripts/gpu-check`` (issue 34), one sub-command each, each ending with
one line ``RESULT {json}`` that the driver puts in its summary table.

    python scripts/gpu_check_steps.py env --mpiexec M
    mpiexec -n 1 python scripts/gpu_check_steps.py dry      (all of them on the CPU, small)
    python scripts/gpu_check_steps.py lars --device cuda|cpu
    python scripts/gpu_check_steps.py augment --device cuda|cpu
    mpiexec -n 1 python scripts/gpu_check_steps.py resnet --device cuda|cpu [--model resnet50 --batch 64 --size 224]
    python scripts/gpu_check_steps.py decode --device cuda        (needs torchvision built for the node's torch)

``--device cpu`` runs the same code on the CPU with small sizes: the dry run (``gpu-check --cpu``)
that ``make test`` runs, so the GPU check cannot rot. Nothing here has run on a GPU yet.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

MPI_INFO = ("from mpi4py import MPI\nfrom hpctrain.comm import cuda_mpi\n"
            "print(MPI.Get_library_version().splitlines()[0].strip())\n"
            "aware, why = cuda_mpi.cuda_aware()\nprint(f'CUDA-aware: {aware} ({why})')\n")


def result(**fields) -> None:
    print("RESULT " + json.dumps(fields), flush=True)


def env(args) -> int:
    """What the node has: GPUs, torch, CuPy (with an NVRTC compile), the MPI library and whether
    it is CUDA-aware, and the preflight's missing pieces."""
    import importlib.util
    smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True) if _which("nvidia-smi") else None
    print("nvidia-smi -L:", smi.stdout.strip() if smi else "not installed")
    spec = importlib.util.spec_from_file_location("gpu_preflight", os.path.join(ROOT, "scripts", "gpu_preflight.py"))
    pre = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pre)
    missing, found = [], []
    for name, check in pre.CHECKS.items():
        if getattr(args, "dry", False) and name == "libmpi":
            continue        # the dry run has MPI loaded in this process already (below)
        ok, text = check(args)
        (found if ok else missing).append(text)
        print(("ok      " if ok else "MISSING ") + text)
    if getattr(args, "dry", False):
        from hpctrain.comm import cuda_mpi
        from mpi4py import MPI
        mpi_text = f"{MPI.Get_library_version().splitlines()[0].strip()}\nCUDA-aware: {cuda_mpi.cuda_aware()}"
    else:
        run = subprocess.run([sys.executable, "-c", MPI_INFO], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": ROOT})
        mpi_text = run.stdout.strip() or run.stderr.strip()[-500:]
    print(mpi_text)
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    result(step="environment", gpu=gpu, torch=torch.__version__, missing=[m.split(":")[0] for m in missing],
           mpi=(mpi_text.splitlines() or ["?"])[0][:60])
    return 0


def _which(cmd: str) -> bool:
    import shutil
    return shutil.which(cmd) is not None


def lars(args) -> int:
    """LARS over a few steps three ways: the fused kernel path (``kernels.lars_update``: the CuPy
    kernel on a GPU with CuPy, its torch reference otherwise), torch ``_foreach`` on the same
    device, and ``_foreach`` on the CPU; a channels_last weight among them (issue 34, N5)."""
    import torch

    from hpctrain.optim import LARS
    dev = torch.device(args.device)
    g = torch.Generator().manual_seed(4)
    shapes = [(64, 32, 3, 3), (256, 128), (128,), (32, 16, 1, 1), (10,)]
    weights = [torch.randn(s, generator=g) for s in shapes]
    grads = [[torch.randn(s, generator=g) * 0.01 for s in shapes] for _ in range(args.steps)]

    def run(device, fused):
        ps = [torch.nn.Parameter(w.clone().to(device)) for w in weights]
        ps[0].data = ps[0].data.to(memory_format=torch.channels_last)
        opt = LARS(ps, lr=0.5, weight_decay=1e-4, fused_update=fused)
        for step in grads:
            for p, gr in zip(ps, step):
                p.grad = gr.to(device).to(memory_format=torch.preserve_format)
                if p.dim() == 4:
                    p.grad = p.grad.contiguous(memory_format=torch.channels_last)
            opt.step()
        return [p.detach().cpu() for p in ps], f"norms {opt.ran['norms']}, update {opt.ran['update']}"
    ref, _ = run(torch.device("cpu"), False)
    fused, backend = run(dev, True)
    foreach, _ = run(dev, False)

    def rel(a, b):
        return max(float((x - y).abs().max() / (y.abs().max() + 1e-30)) for x, y in zip(a, b))
    print(f"fused path ran: {backend}")
    out = {"device": str(dev), "fused_vs_cpu": rel(fused, ref), "foreach_vs_cpu": rel(foreach, ref),
           "fused_vs_foreach": rel(fused, foreach)}
    print(json.dumps(out))
    ok = max(out["fused_vs_cpu"], out["foreach_vs_cpu"]) < 1e-5
    figures = {k: f"{v:.1e}" for k, v in out.items() if k != "device"}
    result(step="lars", ok=ok, backend=backend.split(" for ")[0], **figures)
    return 0 if ok else 1


def augment(args) -> int:
    """Normalisation and augmentation of raw uint8 batches on the device against the same on the
    CPU (same generator: same crops and flips), and the host syncs the device path makes
    (``torch.cuda.set_sync_debug_mode``, counted per batch; none expected)."""
    import torch

    from hpctrain.data.augment import Augment, BatchPrep, Normalize, generator_for
    dev = torch.device(args.device)
    g = torch.Generator().manual_seed(9)
    norm = {"mean": [120.0, 115.0, 100.0], "std": [60.0, 58.0, 57.0]}
    cases = {"padcrop 32px": torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=g),
             "rrc 224px": torch.randint(0, 256, (8 if dev.type == "cpu" else 32, 3, 224, 224),
                                        dtype=torch.uint8, generator=g)}
    report, worst, syncs = {}, 0.0, 0
    for name, raw in cases.items():
        want = BatchPrep(Normalize(norm, 3), Augment(), functools.partial(generator_for, 3, 0, 0))(raw)
        prep = BatchPrep(Normalize(norm, 3), Augment(), functools.partial(generator_for, 3, 0, 0))
        src = raw.pin_memory() if dev.type == "cuda" else raw
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if dev.type == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
            try:
                got = prep(src.to(dev, non_blocking=True))
            finally:
                if dev.type == "cuda":
                    torch.cuda.set_sync_debug_mode("default")
        n_sync = sum("synchroniz" in str(w.message) for w in caught)
        diff = float((got.cpu() - want).abs().max())
        report[name] = {"max_abs_diff": diff, "host_syncs": n_sync if dev.type == "cuda" else None}
        worst, syncs = max(worst, diff), syncs + n_sync
        for w in caught[:3]:
            print(f"{name}: {w.message}")
    print(json.dumps(report))
    ok = worst < 1e-3
    result(step="augment", ok=ok, max_abs_diff=f"{worst:.1e}", host_syncs=syncs if dev.type == "cuda" else "n/a (CPU)")
    return 0 if ok else 1


def resnet(args) -> int:
    """Images per second of a training step (SGD momentum, synthetic data): torch's plain
    single-device loop against hpctrain's ``DistributedTrainer`` at one rank, in fp32 and in
    bf16 autocast with channels_last; the same model, batch and timing for both."""
    import torch
    from mpi4py import MPI

    from hpctrain.models import build_model
    from hpctrain.topology import Topology
    from hpctrain.trainer import DistributedTrainer
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.cuda.set_device(0)
        torch.backends.cudnn.benchmark = True
    topo = Topology.create(MPI.COMM_WORLD)
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(args.batch, 3, args.size, args.size, generator=g)
    y = torch.randint(0, 1000, (args.batch,), generator=g).to(dev)
    loss_fn = torch.nn.CrossEntropyLoss()

    def settle():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def timed(step):
        for _ in range(args.warmup):
            step()
        settle()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        settle()
        return args.batch * args.steps / (time.perf_counter() - t0)

    rows = []
    for precision in ("fp32", "bf16+channels_last"):
        cl = precision != "fp32"
        fmt = torch.channels_last if cl else torch.contiguous_format
        x = x0.to(dev).contiguous(memory_format=fmt)
        ips = {}
        for who in ("torch", "hpctrain"):
            torch.manual_seed(0)
            model = build_model(args.model, num_classes=1000, in_channels=3).to(dev, memory_format=fmt)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            if who == "torch":
                def step(model=model, opt=opt, x=x, cl=cl):
                    opt.zero_grad(set_to_none=False)
                    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cl):
                        loss = loss_fn(model(x), y)
                    loss.backward()
                    opt.step()
                ips[who] = timed(step)
            else:
                trainer = DistributedTrainer(model, opt, topo, strategy="flat", tune="static", loss_fn=loss_fn,
                                             compute="bf16" if cl else "fp32")
                ips[who] = timed(lambda trainer=trainer, x=x: trainer.step(x, y))
                trainer.close()
            del model, opt
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        rows.append({"precision": precision, "torch_img_s": round(ips["torch"], 1),
                     "hpctrain_img_s": round(ips["hpctrain"], 1),
                     "ratio": round(ips["hpctrain"] / ips["torch"], 3)})
        print(json.dumps(rows[-1]), flush=True)
    topo.close()
    result(step="resnet", model=args.model, batch=args.batch, size=args.size, device=str(dev), rows=rows)
    return 0


def jpeg_batch(n: int, seed: int = 6) -> list[bytes]:
    """``n`` JPEGs (quality 90) of smooth random pictures at camera-like sizes, made with Pillow."""
    import io

    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = (375, 500) if i % 2 else (480, 640)
        coarse = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
        img = Image.fromarray(coarse).resize((w, h), Image.BILINEAR)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def decode(args, decoder=None) -> int:
    """JPEG batch decode on the device (``hpctrain.data.gpudecode.torchvision_decode``: nvJPEG;
    ``decoder`` is a test's stand-in) against Pillow's decode of the same files: mean and largest
    difference per pixel (two IDCTs may differ by a few levels), and images per second."""
    import io

    import numpy as np
    import torch
    from PIL import Image

    from hpctrain.data import gpudecode
    decoder = decoder or gpudecode.torchvision_decode
    dev = torch.device(args.device)
    files = jpeg_batch(args.n)
    data = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files]
    want = [np.asarray(Image.open(io.BytesIO(f)).convert("RGB")).transpose(2, 0, 1) for f in files]

    def settle():
        if dev.type == "cuda":
            torch.cuda.synchronize()
    got = decoder(data, dev)
    settle()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        decoder(data, dev)
    settle()
    img_s = args.n * args.steps / (time.perf_counter() - t0)
    diffs = [np.abs(g.cpu().numpy().astype(np.int16) - w.astype(np.int16)) for g, w in zip(got, want)]
    shapes_ok = all(g.shape == w.shape for g, w in zip(got, want))
    mean = float(np.mean([d.mean() for d in diffs])) if shapes_ok else float("inf")
    ok = shapes_ok and mean < 2.0
    result(step="decode", ok=ok, device=str(dev), images=args.n, img_s=round(img_s, 1),
           mean_abs_diff=f"{mean:.2f}", max_abs_diff=int(max(int(d.max()) for d in diffs)) if shapes_ok else None)
    return 0 if ok else 1


def dry(args) -> int:
    """``gpu-check --cpu``: every step that has a CPU form, in this one process (one torch and
    MPI start-up instead of four: the dry run runs in ``make test``), at small sizes; each
    prints its own RESULT line. Run under ``mpiexec -n 1`` (the ResNet step makes a topology)."""
    ns = argparse.Namespace
    status = env(ns(mpiexec=args.mpiexec, dry=True))
    status |= lars(ns(device="cpu", steps=2))
    status |= augment(ns(device="cpu", steps=1))
    status |= resnet(ns(device="cpu", model="resnet20", batch=2, size=32, steps=1, warmup=0))
    return status


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    e = sub.add_parser("env")
    e.add_argument("--mpiexec", default="mpiexec")
    for name in ("lars", "augment", "resnet", "decode"):
        s = sub.add_parser(name)
        s.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
        s.add_argument("--steps", type=int, default={"lars": 5, "augment": 1, "resnet": 20, "decode": 10}[name])
        if name == "decode":
            s.add_argument("--n", type=int, default=64, help="JPEGs in the batch")
        if name == "resnet":
            s.add_argument("--model", default="resnet50")
            s.add_argument("--batch", type=int, default=64)
            s.add_argument("--size", type=int, default=224)
            s.add_argument("--warmup", type=int, default=5)
    d = sub.add_parser("dry")
    d.add_argument("--mpiexec", default="mpiexec")
    args = p.parse_args(argv)
    return {"env": env, "lars": lars, "augment": augment, "resnet": resnet, "decode": decode,
            "dry": dry}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
