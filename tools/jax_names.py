"""Every JAX name the project uses, and whether the installed JAX has it.

``python tools/jax_names.py`` reads the project's Python files with ``ast`` (nothing of the
project is imported), collects each ``jax...`` name they reach -- imports, attribute chains on
imported JAX modules (``jnp.where``, ``jax.lax.top_k``), and the options given to
``jax.config.update`` -- and resolves each in the JAX of this Python. It prints the missing
ones and exits 1 if there are any, except names the code itself checks for first
(``hasattr(jax.scipy.special, "erfcx")``), which are listed as optional. Run it under another JAX to check that release without
running the test suite there (README "Versions"). It also says whether that JAX lies in
pyproject's declared range (``packaging``'s specifiers), and fails on names the installed JAX
deprecates (reaching them warns: JAX 0.12 moved ``jax.core`` and ``pxla`` names to
``jax.extend``), except, again, names the code checks for first.
"""

from __future__ import annotations

import ast
import copy
import importlib
import pathlib
import sys
import warnings

from declared_range import allows, declared_range

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ("cstorch", "jax_backend", "compat", "tools", "benchmarks", "examples", "tests")


def _dotted(node) -> list | None:
    """``a.b.c`` -> ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id] + parts[::-1]
    return None


def names_in(tree) -> tuple:
    """``(names, optional)``: the ``jax``/``jaxlib`` names a module uses (its aliases
    resolved), and those among them it looks for with ``hasattr`` before use."""
    aliases, used, options, optional = {}, set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root in ("jax", "jaxlib"):
                    used.add(alias.name)
                    aliases[alias.asname or root] = alias.name if alias.asname else root
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and node.module
            and node.module.split(".")[0] in ("jax", "jaxlib")
        ):
            for alias in node.names:
                if alias.name != "*":
                    used.add(f"{node.module}.{alias.name}")
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = _dotted(node)
            if parts and parts[0] in aliases:
                used.add(".".join([aliases[parts[0]]] + parts[1:]))
        if (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            parts = _dotted(node.func)
            if (
                parts
                and parts[0] in aliases
                and ".".join([aliases[parts[0]]] + parts[1:]) == "jax.config.update"
            ):
                options.add(node.args[0].value)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "hasattr"
            and len(node.args) == 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            parts = _dotted(node.args[0])
            if parts and parts[0] in aliases:
                optional.add(".".join([aliases[parts[0]]] + parts[1:] + [node.args[1].value]))
    # The other branch of ``if hasattr(jax..., "name"):`` is the fallback for releases
    # without that name: what only it uses need exist only there.
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.orelse and _hasattr_of_jax(node.test, aliases):
            fallback = names_in(ast.Module(body=node.orelse, type_ignores=[]))[0]
            optional |= fallback - names_in(_without(tree, node.orelse))[0]
    return used | {f"jax.config:{option}" for option in options}, optional


def _hasattr_of_jax(test, aliases) -> bool:
    if not (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "hasattr"
        and len(test.args) == 2
    ):
        return False
    parts = _dotted(test.args[0])
    return bool(parts) and parts[0] in aliases


def _without(tree, statements):
    """A copy of ``tree`` without ``statements`` (the original is left as it is)."""
    for statement in statements:
        statement.jax_names_drop = True
    try:
        clone = copy.deepcopy(tree)  # the marks are copied with the nodes
    finally:
        for statement in statements:
            del statement.jax_names_drop

    class Drop(ast.NodeTransformer):
        def generic_visit(self, node):
            for field, value in ast.iter_fields(node):
                if isinstance(value, list):
                    setattr(
                        node, field, [v for v in value if not getattr(v, "jax_names_drop", False)]
                    )
            return super().generic_visit(node)

    return Drop().visit(clone)


def project_names() -> tuple:
    """``({name: [file, ...]}, optional names)`` over the project's sources."""
    found: dict = {}
    optional: set = set()
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            if ".venv" in path.parts:
                continue
            try:
                tree = ast.parse(path.read_text(), str(path))
            except SyntaxError:
                continue
            names, guarded = names_in(tree)
            optional |= guarded
            for name in names:
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found, optional


def resolves(name: str) -> bool:
    """Whether ``name`` exists in the installed JAX (a module, or attributes below one)."""
    return _look_up(name)[0]


def deprecation(name: str) -> str | None:
    """The deprecation warning the installed JAX gives when ``name`` is reached, or None."""
    return _look_up(name)[1]


def _look_up(name: str) -> tuple:
    """``(exists, deprecation message or None)``."""
    if name.startswith("jax.config:"):
        import jax

        option = name.split(":", 1)[1]
        return option in getattr(jax.config, "values", {}) or hasattr(jax.config, option), None
    parts = name.split(".")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exists = _resolve(parts)
    messages = [
        str(w.message)
        for w in caught
        if issubclass(w.category, (DeprecationWarning, FutureWarning))
    ]
    return exists, (messages[0] if exists and messages else None)


def _resolve(parts: list) -> bool:
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def main() -> int:
    import jax

    names, optional = project_names()
    absent = {n: files for n, files in sorted(names.items()) if not resolves(n)}
    missing = {n: files for n, files in absent.items() if n not in optional}
    deprecated = {n: deprecation(n) for n in sorted(names) if n not in absent}
    deprecated = {n: message for n, message in deprecated.items() if message}
    failing = {n: message for n, message in deprecated.items() if n not in optional}
    private = sorted(n for n in names if "._src" in n or n.startswith("jaxlib"))
    supported = declared_range("jax")
    inside = allows(supported, jax.__version__)
    print(
        f"JAX {jax.__version__} ({'inside' if inside else 'OUTSIDE'} the declared range "
        f"jax{supported}): {len(names)} names used by the project, {len(missing)} missing, "
        f"{len(failing)} deprecated; private ones used: {', '.join(private) or 'none'}"
    )
    for name in sorted(set(absent) - set(missing)):
        print(f"  absent, but the code checks for it first: {name}")
    for name in sorted(set(deprecated) - set(failing)):
        print(f"  deprecated, but the code checks for it first: {name}")
    for name, files in missing.items():
        print(f"  missing: {name}  ({', '.join(files[:3])}{' ...' if len(files) > 3 else ''})")
    for name, message in failing.items():
        files = names[name]
        print(
            f"  deprecated: {name}  ({', '.join(files[:3])}{' ...' if len(files) > 3 else ''})"
            f": {message[:200]}"
        )
    return 1 if missing or failing else 0


if __name__ == "__main__":
    sys.exit(main())
