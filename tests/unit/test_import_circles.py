"""No import circle in the library, counting imports inside functions: a circle hidden by a lazy
import still ties the modules together (neither can be read, tested or moved alone). The graph is
read from the source (ast), so an import that only runs on some path counts as well."""
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = {"hpctrain": "hpctrain", "data_tools": "hpctrain.data_tools", "kernels": "hpctrain.kernels"}


def modules(root: str) -> dict[str, str]:
    """Dotted module name -> file, for every package folder of ``PACKAGES`` under ``root``."""
    found = {}
    for folder, dotted in PACKAGES.items():
        for d, _, files in os.walk(os.path.join(root, folder)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(d, f), os.path.join(root, folder))[:-3]
                    parts = [p for p in rel.split(os.sep) if p != "__init__"]
                    found[".".join([dotted, *parts])] = os.path.join(d, f)
    return found


def edges(mods: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the library modules it imports anywhere in its file (a package's edges to its own
    submodules, and theirs to it, are left out: re-exports are not circles)."""
    out: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            out[name] |= {t for t in names if t in mods and t != name and not t.startswith(name + ".")
                          and not name.startswith(t + ".")}
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1:
                found.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_a_circle_through_an_import_inside_a_function_is_found(tmp_path):
    files = {"hpctrain/__init__.py": "", "hpctrain/a.py": "from hpctrain.b import f\n",
             "hpctrain/b.py": "def f():\n    from hpctrain import a\n",
             "hpctrain/c.py": "from . import a\n", "hpctrain/pkg/__init__.py": "from hpctrain.pkg.d import g\n",
             "hpctrain/pkg/d.py": "from hpctrain.pkg import e\n", "hpctrain/pkg/e.py": "from .. import c\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph = edges(modules(str(tmp_path)))
    assert graph["hpctrain.c"] == {"hpctrain.a"} and graph["hpctrain.pkg.e"] == {"hpctrain.c"}
    assert circles(graph) == [["hpctrain.a", "hpctrain.b"]]


def test_the_library_has_no_import_circle():
    assert circles(edges(modules(ROOT))) == []
