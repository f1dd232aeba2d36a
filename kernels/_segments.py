"""Walk many tensors as cache-sized segments of one flat buffer (CPU references' loop).

A segment is either one slice of a tensor (at most `chunk_elems`) or a run of whole consecutive
tensors smaller than `run_below` (default `chunk_elems`) elements, at most `chunk_elems`
together. Runs cut the per-tensor dispatch cost (a fixed cost per torch op, which dominates for
ResNet-50's ~100 BatchNorm and bias tensors of a few hundred elements) to one op per run. Runs
made packing many 8 K-element tensors markedly faster, and tensors of 32-120 K elements cost the
same either way, so the default gathers everything below a chunk (measurements:
docs/environment.md).
"""
from collections.abc import Iterator


def segments(tensors, chunk_elems, run_below=None) -> Iterator[tuple[int, int, list]]:
    """Yield `(offset, n_elems, parts)`: `parts` are 1-D views covering buffer[offset:offset+n]."""
    run_below = chunk_elems if run_below is None else run_below
    offset = 0
    run: list = []
    run_elems = run_offset = 0
    for t in tensors:
        flat = t.view(-1)
        n = flat.numel()
        if n == 0:
            continue
        small = n < min(run_below, chunk_elems)
        if run and (not small or run_elems + n > chunk_elems):
            yield run_offset, run_elems, run
            run, run_elems = [], 0
        if small:
            if not run:
                run_offset = offset
            run.append(flat)
            run_elems += n
        else:
            for begin in range(0, n, chunk_elems):
                end = min(begin + chunk_elems, n)
                yield offset + begin, end - begin, [flat[begin:end]]
        offset += n
    if run:
        yield run_offset, run_elems, run
