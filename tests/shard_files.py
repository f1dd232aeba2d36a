"""Shard directories for tests that damage them: the digits converted once, a byte flipped."""
import subprocess
import sys


def convert_digits(out, shards: int = 4, block_kib: int | None = None, block_digest: str | None = None) -> str:
    """``python -m hpctrain.data_tools convert --from digits`` into ``out`` (as a user runs it)."""
    extra = ["--block-kib", str(block_kib)] if block_kib else []
    extra += ["--block-digest", block_digest] if block_digest else []
    r = subprocess.run([sys.executable, "-m", "hpctrain.data_tools", "convert", "--from", "digits", "--out", str(out),
                        "--shards", str(shards), "--no-progress", *extra], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return str(out)


def flip(path: str, pos: int) -> None:
    """Invert the lowest bit of the byte at ``pos``: the smallest change a disk or a copy makes."""
    with open(path, "r+b") as fh:
        fh.seek(pos)
        b = fh.read(1)[0]
        fh.seek(pos)
        fh.write(bytes([b ^ 0x01]))
