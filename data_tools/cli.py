"""``hpctrain-data {convert,verify,inspect}`` (``python -m hpctrain.data_tools``): make, check and look at
HDF5 shard directories.

Parallel conversion: ``mpiexec -n P python -m hpctrain.data_tools convert --from imagefolder SRC --out DIR
--shards N`` (each rank converts every P-th shard; rank 0 writes the index last).
"""
import argparse
import os
import sys

from hpctrain.data.index import BLOCK_BYTES, BLOCK_DIGEST, BLOCK_DIGESTS, ShardError

from .readers import SOURCES
from .sources import MAX_CLASSES, MAX_SAMPLE_BYTES, STORE_DTYPES, SourceError, cast_source, check_sample_bytes


class _SourceNames(tuple):
    """``--from`` choices: listed as the registered names, and also ``module:name`` (a plugin)."""

    def __contains__(self, name) -> bool:
        return name in SOURCES


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m hpctrain.data_tools", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="convert a dataset into HDF5 shards (under mpiexec: in parallel)",
                       epilog=f"Limits (bad input is one error line, status 2): labels 0..{MAX_CLASSES - 1}; "
                              f"one sample at most {MAX_SAMPLE_BYTES >> 20} MiB after --size; --test-fraction "
                              f"in [0, 1) leaving a training sample; integer or real float samples, finite "
                              f"unless --allow-nonfinite; ImageFolder entries must be regular files.")
    c.add_argument("src", nargs="?", help="source file or folder (not needed for digits)")
    c.add_argument("test_src", nargs="?", metavar="TEST_SRC",
                   help="npz only: a second .npz holding the test split (x, y); same as --test-file")
    c.add_argument("--from", dest="kind", required=True, choices=_SourceNames(sorted(SOURCES)),
                   help="a registered reader, or package.module:name of a reader file (hpctrain/config/registries.py)")
    c.add_argument("--out", required=True, help="output shard directory")
    c.add_argument("--shards", type=int, default=1, help="shards per split")
    c.add_argument("--size", type=int, nargs=2, metavar=("H", "W"), help="resize to cover H×W, then centre-crop")
    c.add_argument("--encode", choices=("raw", "jpeg"), default="raw",
                   help="raw: decoded uint8 arrays; jpeg: encoded bytes (vlen), decoded by the loader")
    c.add_argument("--max-side", type=int, metavar="N",
                   help="imagefolder --encode jpeg: re-encode only images whose longer side exceeds N, shrunk to N "
                        "(the others keep their bytes)")
    c.add_argument("--test-fraction", type=float, default=0.2,
                   help="held-out share in [0, 1) when the source has no test split (said when used)")
    c.add_argument("--test-file", metavar="NPZ",
                   help="npz only: the test split from this .npz (arrays x, y) instead of a held-out share")
    c.add_argument("--dtype", choices=STORE_DTYPES,
                   help="store float samples as this dtype (float64 input is otherwise stored as float64, "
                        "twice the bytes; the model computes in float32 either way)")
    c.add_argument("--allow-nonfinite", action="store_true",
                   help="convert float samples holding NaN/inf (refused by default: they train to NaN); "
                        "bool, complex and object samples are always refused (store bool as uint8)")
    c.add_argument("--seed", type=int, default=0, help="seed of held-out splits and of the ImageFolder order")
    c.add_argument("--class-names", help="comma-separated class names (overrides the source's)")
    c.add_argument("--no-resume", action="store_true", help="reconvert shards even if already done")
    c.add_argument("--block-kib", type=int, default=BLOCK_BYTES >> 10,
                   help="about this many KiB per block of the per-block digests that the loader checks as it "
                        "reads (default %(default)s; raw samples: the power-of-two number of samples nearest it, "
                        "the blocks aligned with the samples; smaller: a larger index)")
    c.add_argument("--block-digest", choices=tuple(BLOCK_DIGESTS), default=BLOCK_DIGEST,
                   help="the per-block digest (default %(default)s: fast enough to check as the first epoch "
                        "reads; sha256: several times slower to check, writes a version 3 index (blocks from byte 0) "
                        "that hpctrain before v4 reads: see docs/data.md)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    v = sub.add_parser("verify", help="check every shard against the index (checksums, shapes, labels)")
    v.add_argument("dir")
    i = sub.add_parser("inspect", help="print a summary; --grid writes a PNG of samples "
                                       "(images, or a line plot per sample of 1-D data)")
    i.add_argument("dir")
    i.add_argument("--grid", metavar="PNG", help="write a grid of the first samples to this PNG")
    i.add_argument("--split", default="train")
    i.add_argument("-n", type=int, default=64, help="samples in the grid")
    i.add_argument("--no-verify", action="store_true", help="skip the shards' SHA-256 check (reads only labels)")
    return ap


def _convert(args) -> str:
    from mpi4py import MPI

    from .writer import convert
    comm = MPI.COMM_WORLD                     # the entry point: the only place that names it
    if args.size and min(args.size) < 1:
        raise ValueError(f"--size {args.size[0]} {args.size[1]}: must be positive")
    if args.size:                            # 3 uint8 channels at most: refused before any source is read
        check_sample_bytes((3, *args.size), "uint8", f"--size {args.size[0]} {args.size[1]}")
    if args.block_kib < 1:
        raise ValueError(f"--block-kib {args.block_kib}: must be at least 1")
    if not 0 <= args.test_fraction < 1:
        raise ValueError(f"--test-fraction {args.test_fraction}: must be in [0, 1)")
    if args.test_src and args.test_file and args.test_src != args.test_file:
        raise ValueError(f"two test files: {args.test_src} and --test-file {args.test_file}; give one")
    test_file = args.test_file or args.test_src
    if test_file and args.kind != "npz":
        raise ValueError(f"{test_file}: a test file is read by --from npz only (--from {args.kind} has one source)")
    names = [n.strip() for n in args.class_names.split(",")] if args.class_names else None
    extra = {"test_file": test_file} if test_file else {}
    if args.max_side is not None:
        if args.max_side < 1:
            raise ValueError(f"--max-side {args.max_side}: must be positive")
        if args.kind != "imagefolder" or args.encode != "jpeg":
            raise ValueError("--max-side applies to --from imagefolder --encode jpeg only")
        extra["max_side"] = args.max_side
    source = SOURCES[args.kind](args.src, test_fraction=args.test_fraction, seed=args.seed,
                                size=tuple(args.size) if args.size else None, encode=args.encode, class_names=names,
                                allow_nonfinite=args.allow_nonfinite, **extra)
    source = cast_source(source, args.dtype)
    src = os.path.abspath(args.src) if args.src else ""
    mtime = os.path.getmtime(src) if src and os.path.exists(src) else ""
    tag = f"{args.kind}|{src}|{mtime}|{args.seed}|{args.test_fraction}"
    if test_file or args.dtype:              # a different test file or dtype must not resume old shards
        tfile = os.path.abspath(test_file) if test_file else ""
        tag += f"|{tfile}|{os.path.getmtime(tfile) if tfile and os.path.exists(tfile) else ''}|{args.dtype or ''}"
    meta = convert(source, args.out, args.shards, comm=comm, tag=tag, resume=not args.no_resume,
                   progress=not args.no_progress, block_bytes=args.block_kib << 10,
                   block_digest=args.block_digest)
    counts = ", ".join(f"{k} {v['num_samples']}" for k, v in meta["splits"].items())
    skipped = f" ({meta['skipped_shards']} finished shard(s) verified and kept)" if meta["skipped_shards"] else ""
    notes = "".join(f"\nnote: {n}" for n in source.notes)
    return (f"wrote {args.out}: {counts} samples, {meta['encoding']} {meta['dtype']} "
            f"{tuple(meta['sample_shape'])}, {meta['num_classes']} classes on {comm.Get_size()} rank(s){skipped}"
            f"{notes}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from . import inspection as inspect
    from .writer import ConvertError
    rank = 0
    try:
        if args.cmd == "convert":
            from mpi4py import MPI

            from hpctrain.ops.abort import install_abort_hook
            rank = MPI.COMM_WORLD.Get_rank()
            if MPI.COMM_WORLD.Get_size() > 1:
                install_abort_hook(MPI.COMM_WORLD)   # an unexpected error on one rank ends all ranks
            msg = _convert(args)
        elif args.cmd == "verify":
            msg = inspect.verify(args.dir)
        else:
            msg = inspect.summary(args.dir, verify=not args.no_verify)
            if args.grid:
                msg += "\n" + inspect.grid(args.dir, args.grid, args.split, args.n, verify=not args.no_verify)
    except (ShardError, SourceError, ConvertError, ValueError, ImportError) as exc:
        if rank == 0:
            print(f"data_tools: error: {exc}", file=sys.stderr)
        return 2
    if rank == 0:
        print(msg)
    return 0

