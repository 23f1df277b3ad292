"""Static scan of a Cerebras Model Zoo checkout: which ``cerebras.pytorch`` names it uses, and
whether each one resolves in the ``cerebras.pytorch`` that is importable here.

Usage::

    python tools/zoo_scan.py /path/to/modelzoo/src            # this project (compat/ on the path)
    python tools/zoo_scan.py /path/to/modelzoo/src --as-is    # whatever cerebras.pytorch sys.path gives
    python tools/zoo_scan.py SRC --json out.json               # the full table, machine readable

A "use" is one dotted name, counted once however often it appears:

* ``import cerebras.pytorch.distributed as dist`` uses ``cerebras.pytorch.distributed``;
* ``from cerebras.pytorch.utils.data import Schedule`` uses ``cerebras.pytorch.utils.data.Schedule``;
* an attribute chain on an imported alias, e.g. ``cstorch.backends.csx.debug.debug_args`` (the
  whole chain of plain attribute accesses; a call or subscript ends it). A file that binds the
  same alias to another module too (``import torch.distributed as dist`` beside
  ``import cerebras.pytorch.distributed as dist``) is ambiguous about which one a chain means,
  so its chains on that alias are left out.

A use resolves as Python would run it: an import statement's name when its longest module
prefix imports and the rest are attributes of that module; an attribute chain when the alias's
import resolves and each further part is an attribute (``getattr``: a module the package has not
loaded by then does not count, and a property that raises counts as unresolved). Nothing of the
zoo is imported: its files are only parsed.

Run with ``--as-is`` in an environment with cerebras-pytorch 2.10 installed, the same scan
gives the reference's own count (Release_2.10.0: 129 of its 131 uses resolve there; the zoo
calls ``cerebras.pytorch.distributed.get_rank``/``get_world_size`` on GPU-only paths, which the
reference lacks and this project provides).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import sys

ROOT = "cerebras.pytorch"


def _uses_in_tree(tree: ast.AST) -> dict[str, set[str]]:
    """Dotted ``cerebras.pytorch`` names used by one parsed module, each with how it is
    reached: ``"import"`` (an import statement) or ``"attribute:<alias target>"`` (a chain of
    attributes on an alias bound by an import of ``<alias target>``)."""
    aliases: dict[str, str] = {}  # local name -> dotted name it stands for
    other: set[str] = set()  # local names also bound to a non-cerebras import
    uses: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("cerebras"):
                    other.add(alias.asname or alias.name.split(".")[0])
                if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                    uses.setdefault(alias.name, set()).add("import")
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:  # `import cerebras.pytorch.x` binds `cerebras`
                        aliases["cerebras"] = "cerebras"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("cerebras"):
                other.update(a.asname or a.name for a in node.names)
            if node.module == ROOT or node.module.startswith(ROOT + "."):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    uses.setdefault(full, set()).add("import")
                    aliases[alias.asname or alias.name] = full
            elif node.module == "cerebras":
                for alias in node.names:
                    if alias.name == "pytorch":
                        uses.setdefault(ROOT, set()).add("import")
                        aliases[alias.asname or alias.name] = ROOT

    inner: set[int] = set()  # Attribute nodes that are the value of a longer chain
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            inner.add(id(node.value))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        parts = []
        cur: ast.AST = node
        while isinstance(cur, ast.Attribute):
            parts.append(cur.attr)
            cur = cur.value
        if not isinstance(cur, ast.Name) or cur.id not in aliases or cur.id in other:
            continue  # an alias that is also, say, torch.distributed is ambiguous: skipped
        dotted = ".".join([aliases[cur.id], *reversed(parts)])
        if dotted == ROOT or dotted.startswith(ROOT + "."):
            # resolved as the alias's import, then attribute by attribute
            uses.setdefault(dotted, set()).add(f"attribute:{aliases[cur.id]}")
    return uses


def scan(src: str) -> dict[str, dict]:
    """Map each dotted use to ``{"files": [...], "kinds": {...}}`` (files relative to ``src``)."""
    where: dict[str, dict] = {}
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            if "cerebras" not in text:
                continue
            try:
                tree = ast.parse(text, filename=path)
            except SyntaxError:
                continue
            for use, kinds in _uses_in_tree(tree).items():
                entry = where.setdefault(use, {"files": [], "kinds": set()})
                entry["files"].append(os.path.relpath(path, src))
                entry["kinds"] |= kinds
    return dict(sorted(where.items()))


def resolve(dotted: str, kind: str = "import") -> str | None:
    """None when ``dotted`` resolves, else the reason it does not.

    ``"import"``: as an import statement does, the longest prefix that is a module is imported
    and the rest are its attributes (``from a.b import c`` reads ``c`` from module ``a.b``,
    even when package ``a`` has an attribute ``b`` that is something else).
    ``"attribute:<target>"``: as a chain on an alias runs: ``<target>`` (what the alias was
    imported as) resolves as an import, each further part is an attribute of the object
    before it.
    """
    parts = dotted.split(".")
    if kind.startswith("attribute:"):
        target = kind[len("attribute:") :]
        if target == "cerebras":  # `import cerebras.pytorch...` binds the namespace package
            try:
                base = importlib.import_module(ROOT)
            except Exception as e:  # noqa: BLE001 - any import failure is a finding
                return f"import {ROOT}: {type(e).__name__}: {e}"
            return _attributes(base, parts, 2)
        error = resolve(target, "import")
        if error:
            return error
        base = _import_value(target)
        return _attributes(base, parts, len(target.split(".")))
    for cut in range(len(parts), 1, -1):
        name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and name.startswith(e.name) and e.name.startswith(ROOT):
                continue  # not a module: a shorter prefix, the rest are attributes
            return f"import {name}: {type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - any import failure is a finding
            return f"import {name}: {type(e).__name__}: {e}"
        return _attributes(obj, parts, cut)
    return f"no importable prefix of {dotted}"


def _import_value(dotted: str):
    """The object an import statement binds for ``dotted`` (which resolves)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(dotted)


def _attributes(obj, parts: list, start: int) -> str | None:
    for i in range(start, len(parts)):
        try:
            obj = getattr(obj, parts[i])
        except Exception as e:  # noqa: BLE001
            return f"{'.'.join(parts[: i + 1])}: {type(e).__name__}: {e}"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="the zoo's src directory (holds cerebras/modelzoo)")
    parser.add_argument(
        "--as-is",
        action="store_true",
        help="resolve against sys.path as given (e.g. a reference install) "
        "instead of putting this project and its compat/ first",
    )
    parser.add_argument("--json", help="write {use: {files, kinds, error}} here")
    parser.add_argument("-v", "--verbose", action="store_true", help="list resolved uses too")
    args = parser.parse_args(argv)

    if not os.path.isdir(os.path.join(args.src, "cerebras", "modelzoo")):
        parser.error(f"{args.src} has no cerebras/modelzoo: give the zoo checkout's src/ folder")
    if not args.as_is:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        sys.path[:0] = [here, os.path.join(here, "compat")]

    uses = scan(args.src)
    table = {}
    for use, found in uses.items():
        files = found["files"]
        errors = [e for e in (resolve(use, k) for k in sorted(found["kinds"])) if e]
        error = errors[0] if errors else None
        table[use] = {"files": files, "kinds": sorted(found["kinds"]), "error": error}
        if error or args.verbose:
            status = "MISSING" if error else "ok"
            print(f"{status:8s}{use}" + (f"\n          {error}  [{files[0]}]" if error else ""))
    ok = sum(1 for v in table.values() if v["error"] is None)
    print(f"resolved {ok}/{len(table)} cerebras.pytorch uses")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    return 0 if ok == len(table) else 1


if __name__ == "__main__":
    sys.exit(main())
