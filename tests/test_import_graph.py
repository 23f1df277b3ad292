"""The package layering: ``compat -> cstorch -> jax_backend``, and no import cycles (the
compatibility packages under ``compat/`` included: the 1.x runners, the 2.x Trainer).

The graph is read from the source with ``ast``, so it holds every import the code can run,
including the ones inside functions (a lazy import hides a cycle from Python but not from a
reader, and the next change turns it into a real one). An import of ``pkg.mod`` or
``from pkg import mod`` is an edge to that module; ``from pkg import name`` of a non-module
name is an edge to the package's ``__init__``. Imports under ``if TYPE_CHECKING:`` never run
and are left out.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from tests import paths

pytestmark = pytest.mark.core

ROOT = pathlib.Path(paths.REPO)
PACKAGES = ("cstorch", "jax_backend")
COMPAT_PACKAGES = ("cerebras", "cerebras_pytorch", "modelzoo")  # under compat/


def module_files() -> dict:
    modules = {}
    roots = [(ROOT, p) for p in PACKAGES] + [(ROOT / "compat", p) for p in COMPAT_PACKAGES]
    for base, package in roots:
        for path in sorted((base / package).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking_block(node) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imports(tree):
    """Every Import/ImportFrom node, at any depth, outside ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_type_checking_block(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def resolve_base(module: str, path: pathlib.Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    package = package[: len(package) - node.level + 1]
    return ".".join(package + ([node.module] if node.module else []))


def import_graph() -> dict:
    """``{module: {imported module, ...}}`` over the modules of ``PACKAGES``."""
    modules = module_files()

    def known(name):  # the longest prefix of a dotted name that is one of our modules
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [known(alias.name) for alias in node.names]
            else:
                base = resolve_base(name, path, node)
                targets = [
                    known(f"{base}.{alias.name}")
                    if f"{base}.{alias.name}" in modules
                    else known(base)
                    for alias in node.names
                ]
            graph[name].update(t for t in targets if t is not None and t != name)
    return graph


def strongly_connected_components(graph: dict) -> list:
    """Tarjan's algorithm, iterative (the graph has hundreds of nodes)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


@pytest.mark.slow
def test_the_graph_sees_function_level_imports():
    graph = import_graph()
    assert "cstorch.backend" in graph["cstorch.core.compile"]  # module level
    assert (
        "modelzoo.common.pytorch.pytorch_base_runner"
        in graph["modelzoo.common.pytorch.pytorch_runner"]
    )  # compat modules are in the graph
    assert len(graph) > 100 and sum(map(len, graph.values())) > 200


def test_the_cycle_finder_finds_cycles():
    toy = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert [c for c in strongly_connected_components(toy) if len(c) > 1] == [["a", "b", "c"]]


@pytest.mark.slow
def test_no_import_cycles():
    cycles = [c for c in strongly_connected_components(import_graph()) if len(c) > 1]
    assert not cycles, (
        "import cycles (each line is one strongly connected group of modules; break it by "
        "moving what both sides need into a leaf module):\n"
        + "\n".join(f"  {len(c)} modules: {', '.join(c)}" for c in cycles)
    )


@pytest.mark.slow
def test_the_runners_of_the_1x_api_import_downwards_only():
    """The base runner knows none of the runners built on it, nor the factory that picks one
    (it was a 7-module import circle)."""
    graph = import_graph()
    base = "modelzoo.common.pytorch.pytorch_base_runner"
    below = set()
    stack = [base]
    while stack:
        for target in graph[stack.pop()]:
            if target not in below:
                below.add(target)
                stack.append(target)
    runners = {
        m for m in graph if m.startswith("modelzoo.common.pytorch.pytorch_") and m != base
    } | {"modelzoo.common.pytorch.runner_factory"}
    assert not below & runners, sorted(below & runners)


@pytest.mark.slow
def test_the_api_never_imports_compat():
    edges = [
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        if module.split(".")[0] in PACKAGES
        for target in targets
        if target.split(".")[0] in COMPAT_PACKAGES
    ]
    assert not edges, "cstorch and jax_backend must not import compat/:\n  " + "\n  ".join(edges)


@pytest.mark.slow
def test_the_engine_never_imports_the_api():
    edges = [
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        if module.split(".")[0] == "jax_backend"
        for target in targets
        if target.split(".")[0] == "cstorch"
    ]
    assert not edges, "jax_backend must not import cstorch:\n  " + "\n  ".join(edges)
