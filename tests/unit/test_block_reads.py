"""The checked read path of :class:`hpctrain.data.blocks.BlockCheck` on a plain file, against digests
computed here with xxhash's and hashlib's one-shot functions over the file's own bytes.

Reads start and end inside blocks, cover whole blocks, cut one block at both ends and reach the
file's short last block, so each way a block is hashed (in one call from the read's buffer, or
in parts with the rest read into the reused scratch buffer) is exercised; a flipped byte is
refused whether it lies in the read or in the part of a cut block read on the side.
"""
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import xxhash

from hpctrain.data import ShardError
from hpctrain.data.blocks import BlockCheck

B = 1000                      # not a power of two: no alignment is assumed
SIZE = 10 * B + 321           # a short last block
READS = [(0, 10 * B + 321), (1500, 4200), (4300, 4700), (7000, 9000), (9999, 10 * B + 321), (2, 998)]
DIGESTS = {"xxh3_128": xxhash.xxh3_128_hexdigest, "sha256": lambda b: hashlib.sha256(b).hexdigest()}


def make(tmp_path, digest: str = "xxh3_128"):
    raw = np.random.default_rng(3).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    path = tmp_path / "f.bin"
    path.write_bytes(raw)
    blocks = {"bytes": B, "file_bytes": SIZE, "data": [[0, 11]],
              digest: [DIGESTS[digest](raw[k:k + B]) for k in range(0, SIZE, B)]}
    return str(path), raw, blocks


def read(check: BlockCheck, path: str, a: int, e: int, pool=None) -> bytes:
    out = np.zeros(e - a, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        if not check.read_into(fd, a, memoryview(out).cast("B"), pool):   # all matched before:
            out[:] = np.frombuffer(os.pread(fd, e - a, a), np.uint8)      # the caller reads unchecked
    finally:
        os.close(fd)
    return out.tobytes()


@pytest.mark.parametrize("digest", ["xxh3_128", "sha256"])
@pytest.mark.parametrize("a,e", READS)
def test_clean_reads_give_the_files_bytes_and_check_every_block_they_touch(tmp_path, digest, a, e):
    path, raw, blocks = make(tmp_path, digest)
    check = BlockCheck(path, blocks)
    with ThreadPoolExecutor(2) as pool:
        assert read(check, path, a, e, pool) == raw[a:e]
    touched = set(range(a // B, (e - 1) // B + 1))
    assert {int(k) for k in np.flatnonzero(check.done)} == touched


def test_reads_in_a_row_reuse_the_scratch_buffer_and_stay_right(tmp_path):
    """Each cut block's rest goes through the same scratch buffer: a later read must not see an
    earlier one's bytes (a stale buffer would fail the digest or corrupt the result)."""
    path, raw, blocks = make(tmp_path)
    check = BlockCheck(path, blocks)
    for a, e in [(1500, 4200), (4300, 4700), (4700, 5200), (250, 1499), (5200, SIZE)]:
        assert read(check, path, a, e) == raw[a:e]
    assert check.done.all()


@pytest.mark.parametrize("digest", ["xxh3_128", "sha256"])
@pytest.mark.parametrize("where", ["inside the read", "before the read, same block", "after the read, same block"])
def test_a_flipped_byte_of_a_touched_block_is_refused_naming_file_and_block(tmp_path, digest, where):
    path, raw, blocks = make(tmp_path, digest)
    a, e = 1500, 4200                              # cuts block 1 (head 1000..1500) and block 4 (tail 4200..5000)
    pos = {"inside the read": 3100, "before the read, same block": 1200, "after the read, same block": 4800}[where]
    data = bytearray(raw)
    data[pos] ^= 0x10
    open(path, "wb").write(bytes(data))
    check = BlockCheck(path, blocks)
    with pytest.raises(ShardError) as err, ThreadPoolExecutor(2) as pool:
        read(check, path, a, e, pool)
    k = pos // B
    assert str(err.value) == (f"{path}: checksum mismatch in block {k} (bytes {k * B}..{(k + 1) * B}; "
                              f"file changed or corrupted)")
    assert not check.done.any()                    # nothing counts as checked after a mismatch


def test_blocks_already_checked_are_not_read_again(tmp_path):
    """A read whose blocks all matched earlier returns False: the caller reads it unchecked."""
    path, raw, blocks = make(tmp_path)
    check = BlockCheck(path, blocks)
    assert read(check, path, 1000, 3000) == raw[1000:3000]
    fd = os.open(path, os.O_RDONLY)
    try:
        assert check.read_into(fd, 1200, memoryview(bytearray(1500)), None) is False
    finally:
        os.close(fd)
