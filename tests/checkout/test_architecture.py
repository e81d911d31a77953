"""The house's shape, measured with `ast` over pipelines/, transforms/, shards/ and deploy/: no module
import cycle, no two sub-packages importing each other, no arrow up the floors (deploy/ > pipelines/ >
transforms/ > shards/; shards/ imports no Beam), no function over 50 lines, and an import inside a
function only where `FUNCTION_IMPORTS` below says why. Run as a script it prints today's numbers."""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("pipelines", "transforms", "shards", "deploy")
FLOORS = {"shards": 0, "transforms": 1, "pipelines": 2, "deploy": 3}
MAX_FUNCTION_LINES = 50
MAX_FUNCTION_IMPORTS = 60

# Every import inside a function, by the module it sits in and what it imports, with its one reason. The
# reasons are few: `pretokenize --help` (and `import shards.reader` for a user who only reads) must not pay for
# Beam, pyarrow, torch or a tokenizer library; an optional extra (torch, fsspec's s3, transformers) is imported
# only by the command that needs it; a cluster helper runs where Beam is not installed.
LAZY_HELP = "kept off `pretokenize --help`'s path (Beam, pyarrow or a job's modules load only when a job runs)"
OPTIONAL = "an optional extra, imported only by the command that needs it"
FUNCTION_IMPORTS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    module: str       # the module the import sits in
    target: str       # the module imported (ours, or the top-level name of a third-party one)
    line: int
    in_function: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def sources() -> dict[str, Path]:
    """Our modules by dotted name."""
    return {module_name(p): p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))}


def package_of(module: str) -> str:
    """The sub-package a module lives in (a package's __init__ lives in itself)."""
    return module if (sources()[module].name == "__init__.py") else module.rpartition(".")[0]


def resolve(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement names: ours resolved to the deepest module that exists."""
    if isinstance(node, ast.Import):
        return [_ours(alias.name) for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = package_of(module).split(".")
        anchor = anchor[:len(anchor) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return [_ours(f"{base}.{alias.name}") if f"{base}.{alias.name}" in sources() else _ours(base)
            for alias in node.names]


def _ours(name: str) -> str:
    while name and name not in sources():
        if "." not in name:
            return name
        name = name.rpartition(".")[0]
    return name


class _Walker(ast.NodeVisitor):
    def __init__(self, module: str):
        self.module, self.depth, self.found, self.functions = module, 0, [], []

    def visit_FunctionDef(self, node):
        self.functions.append((node.name, node.lineno, node.end_lineno - node.lineno + 1))
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node):
        self.found += [Import(self.module, t, node.lineno, self.depth > 0) for t in resolve(self.module, node)]

    visit_ImportFrom = visit_Import


@cache
def walked(module: str) -> _Walker:
    walker = _Walker(module)
    walker.visit(ast.parse(sources()[module].read_text(encoding="utf-8")))
    return walker


def imports() -> list[Import]:
    return [i for m in sources() for i in walked(m).found]


def internal_edges() -> set[tuple[str, str]]:
    return {(i.module, i.target) for i in imports() if i.target in sources() and i.target != i.module}


def module_cycles() -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each a cycle or several."""
    graph: dict[str, set[str]] = {m: set() for m in sources()}
    for a, b in internal_edges():
        if not (package_of(a) == a and b.startswith(a + ".")):   # a package's __init__ re-exporting its own
            graph[a].add(b)
    index, low, stack, on, groups = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v), on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop()), on.discard(group[-1])
            if len(group) > 1:
                groups.append(sorted(group))

    for v in graph:
        if v not in index:
            strong(v)
    return groups


def package_ties() -> list[tuple[str, str]]:
    """Pairs of sub-packages each of which imports the other."""
    arrows = {(package_of(a), package_of(b)) for a, b in internal_edges()}
    return sorted((a, b) for a, b in arrows if a < b and (b, a) in arrows and not _nested(a, b))


def _nested(a: str, b: str) -> bool:
    """A package and one inside it are one floor: `shards/reader.py` is the face of its parts in `shards/reading/`."""
    return a.startswith(b + ".") or b.startswith(a + ".")


def arrows_up() -> list[Import]:
    """Imports from a lower floor into a higher one, and Beam imported under shards/."""
    def floor(name):
        return FLOORS.get(name.split(".")[0])

    return [i for i in imports()
            if (floor(i.target) is not None and floor(i.target) > floor(i.module))
            or (i.module.startswith("shards") and i.target == "apache_beam")]


def long_functions() -> list[str]:
    return [f"{m}.{name}:{line} ({n} lines)" for m in sources() for name, line, n in walked(m).functions
            if n > MAX_FUNCTION_LINES]


def function_imports() -> list[Import]:
    """One per import statement inside a function (`from x import a, b` is one)."""
    return list({(i.module, i.line): i for i in imports() if i.in_function}.values())


def test_no_module_import_cycle():
    assert module_cycles() == []


def test_no_two_sub_packages_import_each_other():
    assert package_ties() == []


def test_no_arrow_goes_up_a_floor():
    assert [f"{i.module}:{i.line} -> {i.target}" for i in arrows_up()] == []


def test_no_function_is_over_50_lines():
    assert long_functions() == []


def test_imports_inside_functions_are_few_and_each_has_its_reason():
    found = function_imports()
    assert len(found) <= MAX_FUNCTION_IMPORTS
    unexplained = sorted({(i.module, i.target) for i in found} - FUNCTION_IMPORTS.keys())
    assert unexplained == [], "an import inside a function needs its reason in FUNCTION_IMPORTS"
    stale = sorted(FUNCTION_IMPORTS.keys() - {(i.module, i.target) for i in found})
    assert stale == [], "FUNCTION_IMPORTS names an import no function makes any more"


def test_the_measures_see_what_they_measure(tmp_path):
    """The walker resolves relative imports and marks the ones inside functions."""
    walker = _Walker("transforms.core.batches")
    walker.visit(ast.parse("from . import drops\nfrom ..inputs import read\n"
                           "def f():\n    import pyarrow\n    from shards import layout\n"))
    found = [(i.target, i.in_function) for i in walker.found]
    assert found == [("transforms.core.drops", False), ("transforms.inputs.read", False),
                     ("pyarrow", True), ("shards.layout", True)]
    assert walker.functions == [("f", 3, 3)]


if __name__ == "__main__":
    print("module cycles:", len(module_cycles()))
    for group in module_cycles():
        print("   ", " ".join(group))
    print("two-way ties between sub-packages:", len(package_ties()))
    for a, b in package_ties():
        print("   ", a, "<->", b)
    print("arrows up:", len(arrows_up()))
    for i in arrows_up():
        print(f"    {i.module}:{i.line} -> {i.target}")
    print("functions over 50 lines:", len(long_functions()), *long_functions(), sep="\n    ")
    found = function_imports()
    print("function-level imports:", len(found))
    for key, group in itertools.groupby(sorted(found, key=lambda i: (i.module, i.target)),
                                        key=lambda i: (i.module, i.target)):
        print(f"    {key[0]} -> {key[1]} x{len(list(group))}")
