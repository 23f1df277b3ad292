"""Code rules read from the source, in the manner of ``test_import_graph.py``.

- No module reads another module's private names: ``from pkg.mod import _name`` and
  ``mod._name`` on an imported module of this project are refused, outside an explicit
  allow-list (the alias machinery that makes ``cerebras.pytorch`` and ``cerebras_pytorch``
  the same modules as ``cstorch``). A private name is one with a leading underscore that is
  not a dunder and not a submodule (``from cstorch import _cirh`` imports a private module of
  the same project, which this rule leaves to the import-graph test). A name one needs from
  elsewhere gets a public spelling in its home module instead.
- Every example in ``examples/`` and tool in ``tools/`` is named in the docs (``README.md``
  or a file under ``docs/``), so none is an orphan that nobody knows to run or to keep working.
- The table of a state tensor's legal changes in ``docs/ARCHITECTURE.md`` is the engine's
  (``jax_backend.state._TABLE``), row for row.
"""

from __future__ import annotations

import ast
import re

from tests.test_import_graph import ROOT, module_files, resolve_base

# The alias machinery: "module reads other.module._name" -> why. Old names are aliases of new
# ones through tables and properties kept private so that they are not API of their own.
ALLOWED_PRIVATE_READS = {
    "cerebras.modelzoo.trainer.config reads cstorch.optim.config._OPTIMIZER_ALIASES":
        "the Trainer accepts the old optimizer names the API accepts",
    "cerebras.modelzoo.trainer.config reads cstorch.optim.config._SCHEDULER_ALIASES":
        "the Trainer accepts the old scheduler names the API accepts",
    "cerebras_pytorch.experimental.optim reads cstorch.optim.config._SCHEDULER_ALIASES":
        "the 1.8 scheduler names are aliases of the 2.x ones",
    "cstorch.optim.lr_scheduler reads cstorch.optim.scheduler._alias":
        "the LR schedulers' reference names (initial_learning_rate, ...) alias generic ones",
    "cstorch.backends reads cstorch.utils._flags._flags":
        "the reference's own (private) base class of cstorch.backends' flag groups",
}
DOCS = ["README.md", "docs"]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node) -> list | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None when the chain does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id] + parts[::-1]


def private_reads() -> list:
    """``(module, "other.module._name")`` for every read of another module's private name."""
    modules = module_files()
    reads = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        bound = {}  # local name -> the project module it is bound to by an import
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in modules:
                        bound[alias.asname] = alias.name
                    elif not alias.asname:  # `import a.b` binds `a`
                        root = alias.name.split(".")[0]
                        if root in modules:
                            bound[root] = root
            elif isinstance(node, ast.ImportFrom):
                base = resolve_base(name, path, node)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in modules:
                        bound[alias.asname or alias.name] = full
                    elif (base in modules and base != name and _is_private(alias.name)):
                        reads.append((name, full))
        for node in ast.walk(tree):  # a chain a.b._c.d is met once per prefix; the set dedups
            if not isinstance(node, ast.Attribute):
                continue
            parts = _dotted(node)
            if not parts or parts[0] not in bound:
                continue
            module = bound[parts[0]]
            for attr in parts[1:]:
                if f"{module}.{attr}" in modules:
                    module = f"{module}.{attr}"
                    continue
                if _is_private(attr) and module != name:
                    reads.append((name, f"{module}.{attr}"))
                break
    return sorted(set(reads))


def test_the_rule_sees_both_spellings_of_a_private_read(tmp_path, monkeypatch):
    """A toy tree: a ``from`` import of a private name, and one read through a module."""
    (tmp_path / "cstorch").mkdir()
    (tmp_path / "cstorch" / "__init__.py").write_text("")
    (tmp_path / "cstorch" / "a.py").write_text("_hidden = 1\nshown = 2\n__dunder__ = 3\n")
    (tmp_path / "cstorch" / "b.py").write_text(
        "from cstorch.a import _hidden, shown, __dunder__\n"
        "import cstorch.a\nfrom cstorch import a as alias\n"
        "x = cstorch.a._hidden + alias._hidden + alias.shown\n")
    (tmp_path / "cstorch" / "c.py").write_text("from cstorch import a\nprint(a._hidden)\n")
    import tests.test_import_graph as graph
    monkeypatch.setattr(graph, "ROOT", tmp_path)
    monkeypatch.setattr(graph, "COMPAT_PACKAGES", ())
    monkeypatch.setattr(graph, "PACKAGES", ("cstorch",))
    assert private_reads() == [("cstorch.b", "cstorch.a._hidden"),
                               ("cstorch.c", "cstorch.a._hidden")]


def test_no_module_reads_another_modules_private_names():
    reads = [f"{module} reads {target}" for module, target in private_reads()]
    unexpected = [r for r in reads if r not in ALLOWED_PRIVATE_READS]
    assert not unexpected, (
        "reads of another module's private names (give the name a public spelling in its home "
        "module, or an accessor):\n  " + "\n  ".join(unexpected))
    stale = sorted(set(ALLOWED_PRIVATE_READS) - set(reads))
    assert not stale, f"allow-listed reads that no longer happen (remove them): {stale}"


def _docs_text() -> str:
    texts = []
    for name in DOCS:
        path = ROOT / name
        files = sorted(path.rglob("*.md")) if path.is_dir() else [path]
        texts += [f.read_text() for f in files]
    return "\n".join(texts)


def test_every_example_and_tool_is_named_in_the_docs():
    docs = _docs_text()
    files = sorted(p for folder in ("examples", "tools") for p in (ROOT / folder).iterdir()
                   if p.is_file() and not p.name.startswith((".", "__")))
    assert len(files) >= 10
    orphans = [str(p.relative_to(ROOT)) for p in files if p.name not in docs]
    assert not orphans, f"not named in README.md or docs/: {orphans}"


def _documented_transitions(text: str) -> set:
    """(event, from, to) rows of ARCHITECTURE's "legal changes" table. A row may name several
    events; a change annotated ``(event)`` belongs to that one, the others to the first.
    ``a, b -> c`` is two changes; ``a -> b or c`` too."""
    section = text[text.index("| event | when | legal changes |"):]
    rows = set()
    for line in section.splitlines()[2:]:
        if not line.startswith("|"):
            break
        events_cell, _, changes_cell = (c.strip() for c in line.strip("|").split("|"))
        events = [e.strip() for e in events_cell.split(",")]
        pending = []
        for item in re.split(r"[,;] ", changes_cell.replace("\\*", "*")):
            if "→" not in item:
                pending.append(item.strip())
                continue
            source, target = (part.strip() for part in item.split("→"))
            event = events[0]
            annotated = re.fullmatch(r"(.*?)\s*\((\w+)\)", target)
            if annotated:
                target, event = annotated.group(1), annotated.group(2)
            for origin in [*pending, source]:
                for destination in target.split(" or "):
                    rows.add((event, origin, destination.strip()))
            pending = []
    return rows


def test_the_documented_state_transitions_are_the_engines():
    from jax_backend.state import _TABLE

    documented = _documented_transitions((ROOT / "docs" / "ARCHITECTURE.md").read_text())
    code = {(event, before, after) for before, event, after in _TABLE}
    assert len(code) >= 20
    assert documented == code, (f"only in the docs: {sorted(documented - code)}; "
                                f"only in jax_backend/state.py: {sorted(code - documented)}")


def test_the_transition_reader_sees_a_wrong_row():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    wrong = text.replace("| share | after a step: memory handed out is still held | "
                         "stale+lent → stale+shared |",
                         "| share | after a step: memory handed out is still held | "
                         "stale+lent → synced+shared |")
    assert wrong != text
    assert ("share", "stale+lent", "synced+shared") in _documented_transitions(wrong)


if __name__ == "__main__":
    for module, target in private_reads():
        print(module, "->", target)
