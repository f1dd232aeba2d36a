"""``python -m data_tools {convert,verify}``."""
import argparse
import sys

from data_tools.sources import SOURCES, SourceError
from data_tools.writer import write_dataset
from hpctrain.data.shards import ShardError, ShardSet, read_index


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m data_tools", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="convert a dataset into HDF5 shards")
    c.add_argument("src", nargs="?", help="source file or folder (not needed for digits)")
    c.add_argument("--from", dest="kind", required=True, choices=sorted(SOURCES))
    c.add_argument("--out", required=True, help="output shard directory")
    c.add_argument("--shards", type=int, default=1, help="shards per split")
    c.add_argument("--test-fraction", type=float, default=0.2, help="held-out share when the source has no test split")
    c.add_argument("--seed", type=int, default=0)
    v = sub.add_parser("verify", help="check every shard against the index (checksums, shapes)")
    v.add_argument("dir")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "convert":
            splits, names = SOURCES[args.kind](args.src, test_fraction=args.test_fraction, seed=args.seed)
            meta = write_dataset(args.out, splits, names, args.shards)
            counts = ", ".join(f"{k} {v['num_samples']}" for k, v in meta["splits"].items())
            print(f"wrote {args.out}: {counts} samples of shape {tuple(meta['sample_shape'])}")
        else:
            idx = read_index(args.dir)
            for split in idx.splits:
                s = ShardSet(idx, split)
                s.verify()
                s.check()
                s.close()
            print(f"{args.dir}: OK ({', '.join(f'{k} {idx.num_samples(k)}' for k in idx.splits)})")
    except (ShardError, SourceError, ValueError) as exc:
        print(f"data_tools: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
