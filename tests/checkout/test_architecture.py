"""The house's shape, measured with `ast` over pipelines/, transforms/, shards/ and deploy/: no module
import cycle, no two sub-packages importing each other, no arrow up the floors (deploy/ > pipelines/ >
transforms/ > shards/; shards/ imports no Beam), no function over 50 lines, and an import inside a
function only for the one reason said below (LAZY_LIBRARIES). A package and one nested in it count as one
(shards/reader.py is the face of shards/reading/). Run as a script it prints today's numbers."""

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
# Issue 36 asks for at most 60. The 47 left each keep Beam, pyarrow or an extra off a path that must not wait for
# it (the rule below). A command's Beam graph lives apart from its flags (pipelines/bucketed_graph.py beside
# bucketed.py, scaffold_graph.py, train_bpe_graph.py, remove_graph.py, verify_graph.py), imported in one place
# by the command. Lower this as they go; never raise it.
MAX_FUNCTION_IMPORTS = 47

# The one rule for an import inside a function: it imports a library below (or one of our modules that imports
# one as it loads) that the module it sits in does not load already, which `pretokenize --help`, a job's --help
# and a flag's error must not wait for (Beam and pyarrow take seconds), or which is an optional extra only the
# command that uses it needs (torch, matplotlib, transformers, ...). Anything else is imported at the top of its
# module. The console script itself
# (pipelines/cli.py) loads only what a job it runs needs, so its own lazy imports are the rule's one exception.
LAZY_LIBRARIES = frozenset({
    "apache_beam", "pyarrow", "grpc",  # Beam and what it brings: seconds to import
    "torch", "matplotlib", "tqdm", "transformers", "tokenizers", "huggingface_hub", "yaml",  # optional extras
    "tiktoken", "tiktoken_ext", "quicktok",  # a tokenizer backend, loaded when a tokenizer is
    "s3fs", "gcsfs",  # a cloud store's filesystem, loaded when a path on it is opened
})
LAZY_MODULES = frozenset({"pipelines.cli"})


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
        self.loads: set[str] = set()  # what importing the module imports (not under TYPE_CHECKING)

    def visit_If(self, node):
        if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            self.generic_visit(node)
        else:  # seen by a type checker only: found, but not loaded
            loads = set(self.loads)
            self.generic_visit(node)
            self.loads = loads

    def visit_FunctionDef(self, node):
        self.functions.append((node.name, node.lineno, node.end_lineno - node.lineno + 1))
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node):
        self.found += [Import(self.module, t, node.lineno, self.depth > 0) for t in resolve(self.module, node)]
        if self.depth == 0:
            self.loads.update(resolve(self.module, node))

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


@cache
def lazy_libraries(name: str) -> frozenset[str]:
    """The libraries of LAZY_LIBRARIES that importing ``name`` imports, at once or through our modules."""
    seen, todo, found = set(), [name], set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if module.split(".")[0] in LAZY_LIBRARIES:
            found.add(module.split(".")[0])
        elif module in sources():
            parts = module.split(".")
            todo += [".".join(parts[:k]) for k in range(1, len(parts))] + sorted(walked(module).loads)
    return frozenset(found)


def unexplained_function_imports() -> list[str]:
    """Imports inside functions the rule above does not explain: what they load, the module that makes them
    loads already (or it is none of LAZY_LIBRARIES)."""
    return [f"{i.module}:{i.line} -> {i.target}" for i in function_imports()
            if i.module not in LAZY_MODULES and not lazy_libraries(i.target) - lazy_libraries(i.module)]


def function_imports() -> list[Import]:
    """One per import statement inside a function (`from x import a, b` is one)."""
    return list({(i.module, i.line): i for i in imports() if i.in_function}.values())


def test_no_module_import_cycle():
    assert module_cycles() == []


def test_no_two_sub_packages_import_each_other():
    assert not package_ties()


def test_no_arrow_goes_up_a_floor():
    assert [f"{i.module}:{i.line} -> {i.target}" for i in arrows_up()] == []


def test_no_function_is_over_50_lines():
    assert long_functions() == []


def test_imports_inside_functions_are_few_and_each_has_its_reason():
    assert len(function_imports()) <= MAX_FUNCTION_IMPORTS
    assert unexplained_function_imports() == [], "import it at the top of its module: LAZY_LIBRARIES says why"


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
    print("functions over 50 lines:", len(long_functions()))
    for line in long_functions():
        print("   ", line)
    found = function_imports()
    print("function-level imports without a reason:", len(unexplained_function_imports()))
    for line in unexplained_function_imports():
        print("   ", line)
    print("function-level imports:", len(found))
    for key, group in itertools.groupby(sorted(found, key=lambda i: (i.module, i.target)),
                                        key=lambda i: (i.module, i.target)):
        print(f"    {key[0]} -> {key[1]} x{len(list(group))}")
