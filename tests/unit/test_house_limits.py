"""The limits that keep the library readable, checked on its source: no file over 300 lines, no
function over 60, the training loop short enough to read at a glance, and the config's sections
read in the two modules that own them (the schema's checks and the set-up that turns them into
plain keywords). Each message names the file and what to split."""
import ast
import os
import re

from tests.unit.test_import_circles import PACKAGES, ROOT, modules

MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 60
MAX_TRAIN_LINES = 30
CONFIG_READERS = {"hpctrain/job/config.py", "hpctrain/job/setup.py"}
SECTIONS = ("data", "model", "train", "optim", "comm", "update", "precision", "polish", "ckpt", "run", "report")
SECTION_READ = re.compile(rf"\b(?:cfg|config)\.(?:{'|'.join(SECTIONS)})\b")


def library_files() -> dict[str, str]:
    """Repository-relative path -> source, for every module of the three packages."""
    return {os.path.relpath(p, ROOT): open(p).read() for p in modules(ROOT).values()}


def functions(source: str):
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_the_library_is_found():
    files = library_files()
    assert {f.split(os.sep)[0] for f in files} == set(PACKAGES) and len(files) > 150


def test_no_file_over_the_limit():
    long = {f: len(s.splitlines()) for f, s in library_files().items() if len(s.splitlines()) > MAX_FILE_LINES}
    assert not long, f"split by concern (over {MAX_FILE_LINES} lines): {long}"


def test_no_function_over_the_limit():
    long = [f"{f}:{line} {name} ({n} lines)" for f, s in library_files().items()
            for name, line, n in functions(s) if n > MAX_FUNCTION_LINES]
    assert not long, f"over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_training_loop_reads_at_a_glance():
    [n] = [n for name, _, n in functions(library_files()["hpctrain/job/loop.py"]) if name == "train"]
    assert n <= MAX_TRAIN_LINES, f"hpctrain/job/loop.py train is {n} lines: a concern belongs in an observer"


def test_config_sections_are_read_in_two_modules():
    readers = {f for f, s in library_files().items() if SECTION_READ.search(s)}
    assert readers == CONFIG_READERS, f"read a config section outside set-up: {sorted(readers - CONFIG_READERS)}"
