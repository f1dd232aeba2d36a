"""Walk many tensors as cache-sized segments of one flat buffer (CPU references' loop).

A segment is either one slice of a large tensor or a run of whole consecutive small tensors,
at most `chunk_elems` long. Runs cut the per-tensor Python/dispatch cost (ResNet-50 has ~100
BatchNorm and bias tensors of a few hundred elements each) to one op per run.
"""


def segments(tensors, chunk_elems):
    """Yield `(offset, n_elems, parts)`: `parts` are 1-D views covering buffer[offset:offset+n]."""
    offset = 0
    run, run_elems, run_offset = [], 0, 0
    for t in tensors:
        flat = t.view(-1)
        n = flat.numel()
        if n == 0:
            continue
        if n < chunk_elems and run_elems + n <= chunk_elems:
            if not run:
                run_offset = offset
            run.append(flat)
            run_elems += n
            offset += n
            continue
        if run:
            yield run_offset, run_elems, run
            run, run_elems = [], 0
        if n < chunk_elems:
            run, run_elems, run_offset = [flat], n, offset
            offset += n
            continue
        for begin in range(0, n, chunk_elems):
            end = min(begin + chunk_elems, n)
            yield offset + begin, end - begin, [flat[begin:end]]
        offset += n
    if run:
        yield run_offset, run_elems, run
