"""No measured durations in the code's docstrings and comments (issue 24): a timing belongs to one
machine and one date and goes stale where nobody reruns it. The code says what was chosen and
why; the figures live in docs/environment.md with the machine, the date and the code they
justify. Only docstrings and comments are read (``ast`` and ``tokenize``): a duration in a
message, a format string or a kernel's source is code, not a claim about this host.

Not scanned: ``hpctrain/tools/bench/`` (benchmarks print timings by design) and ``hpctrain/tools/sim/``
(its presets are published networks' parameters, cited there)."""
import ast
import io
import os
import re
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPS = ("hpctrain", "kernels", "data_tools")
SKIP = ("hpctrain/tools/bench/", "hpctrain/tools/sim/")
NUMBER = r"\d+(?:\.\d+)?"
# a duration ("13 ms", "3-35 us", "2 µs") or a speed ratio ("2x faster", "1.7× cheaper")
TIMING = re.compile(NUMBER + r" ?(?:ns|us|µs|ms)\b|" + NUMBER
                    + r" ?[x×] (?:faster|slower|cheaper|dearer|ahead|behind)\b")
ALLOWED = {
    # (file, text on the line around the match): why it stays
    ("hpctrain/tools/cluster/spec.py", "The bucket holds 1 ms of traffic"):
        "design parameter of the emulated network's token bucket, not a measurement",
    ("hpctrain/tools/cluster/spec.py", "20 ms of traffic"):
        "design parameter of the emulated network's queue length, not a measurement",
}


def scanned_files(root=ROOT):
    """The ``.py`` files under :data:`TOPS`, less :data:`SKIP`, relative to ``root``."""
    for top in TOPS:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            for f in sorted(files):
                rel = os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
                if f.endswith(".py") and not rel.startswith(SKIP):
                    yield rel


def prose(source: str):
    """``(line, text)`` of each docstring line and comment of ``source``: string constants that
    stand as statements of their own (module, class, function and attribute docstrings), and
    ``#`` comments."""
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            for k, text in enumerate(node.value.value.splitlines()):
                yield node.lineno + k, text     # the line within the string: close enough to find it
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def timings(rel: str, source: str):
    """``(line, timing, text)`` of each timing in ``source``'s docstrings and comments that
    :data:`ALLOWED` does not name (``rel``: the file's path from the checkout's root)."""
    return [(line, m.group(0), text.strip()) for line, text in prose(source)
            for m in TIMING.finditer(text)
            if not any(f == rel and phrase in text for f, phrase in ALLOWED)]


def tree_timings(root=ROOT):
    """``"file:line: 'timing' in 'text'"`` for every scanned file under ``root``."""
    found = []
    for rel in scanned_files(root):
        with open(os.path.join(root, rel), encoding="utf-8") as fh:
            found += [f"{rel}:{line}: {t!r} in {text!r}" for line, t, text in timings(rel, fh.read())]
    return found


def test_no_measured_durations_in_docstrings_or_comments():
    found = tree_timings()
    assert not found, ("measured timings in docstrings/comments: move the figures to "
                       "docs/environment.md (machine, date, the code they justify) and keep the "
                       "reason in words:\n" + "\n".join(found))


def test_every_allowed_entry_still_matches_a_timing():
    """A stale allowlist entry would silently let a later timing through on its line."""
    for (rel, phrase), why in ALLOWED.items():
        with open(os.path.join(ROOT, rel), encoding="utf-8") as fh:
            lines = [text for _, text in prose(fh.read()) if phrase in text]
        assert any(TIMING.search(text) for text in lines), f"{rel}: {phrase!r} ({why}) no longer there"


def test_the_scan_reads_docstrings_and_comments_but_not_code():
    source = '''"""Module: 13 ms per step on this host."""
X = 1
"""Attribute docstring: 2x faster than the other way."""


def f():
    """Function: 3-35 us per call."""
    y = "a message, 5 ms, is code"   # comment: 0.5 ms per lookup
    return f"{y} 7 µs"
'''
    found = [(line, t) for line, t, _ in timings("hpctrain/x.py", source)]
    assert found == [(1, "13 ms"), (3, "2x faster"), (7, "35 us"), (8, "0.5 ms")]


def test_the_allowlist_is_per_file_and_phrase():
    comment = "# The bucket holds 1 ms of traffic but at least 64 KiB\n"
    assert timings("hpctrain/tools/cluster/spec.py", comment) == []
    assert len(timings("hpctrain/tools/cluster/other.py", comment)) == 1
