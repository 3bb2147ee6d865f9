"""The project's import graph, read statically from the AST of `refengine/` and `quant/`: no cycle, no private name
imported from another module. Function-local imports count (they are how a cycle hides), and importing a
module counts as importing the packages above it that the importer is not inside (their `__init__` runs).

    python tests/test_imports.py          lists the cycles and the private imports
"""
from __future__ import annotations

import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("refengine", "quant")

# None allowed: an entry here is a cycle or a private import someone chose to keep, with the reason beside it.
ALLOWED_CYCLES: list[set] = []
ALLOWED_PRIVATE: set[tuple] = set()


def project_modules() -> dict[str, str]:
    """Dotted module name -> file path, for every module of PACKAGES (a package is its `__init__.py`)."""
    mods = {}
    for top in PACKAGES:
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in files:
                if f.endswith(".py"):
                    parts = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].split(os.sep)
                    mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = os.path.join(dirpath, f)
    return mods


def imports(name: str, path: str, mods: dict[str, str]):
    """(target module, imported name or None, line) for every import of a project module in `name`, at any depth."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods:
                    yield a.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base not in mods:
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                yield (sub, None, node.lineno) if sub in mods else (base, a.name, node.lineno)


def graph(mods: dict[str, str]) -> dict[str, set[str]]:
    """module -> the project modules importing it runs (the target and its packages the importer is not inside)."""
    g = {m: set() for m in mods}
    for m, path in mods.items():
        own = {".".join(m.split(".")[:i]) for i in range(1, m.count(".") + 2)}
        for target, _, _ in imports(m, path, mods):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                t = ".".join(parts[:i])
                if t not in own and t in mods:
                    g[m].add(t)
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(g)))
    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def private_imports(mods: dict[str, str]) -> list[tuple[str, str, str, int]]:
    """(importer, module, name, line): a `_name` imported from another module, or any name from a `_module`
    outside the package that holds it."""
    out = []
    for m, path in mods.items():
        for target, name, line in imports(m, path, mods):
            if target == m:
                continue
            if name and name.startswith("_") and not name.startswith("__"):
                out.append((m, target, name, line))
            parts = target.split(".")
            for i, p in enumerate(parts):
                holder = ".".join(parts[:i])                       # the package the private module belongs to
                if p.startswith("_") and not p.startswith("__") and m != holder and not m.startswith(holder + "."):
                    out.append((m, target, name or "", line))
                    break
    return sorted(out)


def test_no_import_cycle():
    found = [c for c in cycles(graph(project_modules())) if set(c) not in ALLOWED_CYCLES]
    assert not found, "import cycles among project modules:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_private_name_imported_across_modules():
    found = [p for p in private_imports(project_modules()) if p[:3] not in ALLOWED_PRIVATE]
    assert not found, "\n".join(f"{m}:{line} imports {name or '*'} from {t}" for m, t, name, line in found)


def test_the_graph_sees_function_local_imports():
    """A cycle through an import inside a function is found (refengine.compare <-> refengine.flips was one)."""
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
    mods = project_modules()
    assert "quant.cuda" in mods and "refengine.archs.spec" in mods
    assert any(t == "refengine.config" for t, _, _ in imports("refengine.archs", mods["refengine.archs"], mods))


if __name__ == "__main__":
    mods = project_modules()
    for c in cycles(graph(mods)):
        print("cycle:", " <-> ".join(c), "(allowed)" if set(c) in ALLOWED_CYCLES else "")
    for m, t, name, line in private_imports(mods):
        allowed = "(allowed)" if (m, t, name) in ALLOWED_PRIVATE else ""
        print(f"private: {m}:{line} imports {name or '*'} from {t}", allowed)


def test_tests_import_no_private_project_name():
    """The tests use the project's public names too (a private helper a test needs is made public)."""
    mods = project_modules()
    found = []
    for f in sorted(os.listdir(os.path.join(ROOT, "tests"))):
        if f.endswith(".py"):
            path = os.path.join(ROOT, "tests", f)
            for target, name, line in imports(f"tests.{f[:-3]}", path, mods):
                if name and name.startswith("_") and not name.startswith("__"):
                    found.append(f"tests/{f}:{line} imports {name} from {target}")
    assert not found, "\n".join(found)
