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
- No warning counts library frames (``warnings.warn(..., stacklevel=N)``, N > 2) to reach the
  user's line: ``jax_backend.user_frames.warn`` finds it.
- No reference to a document that is not in the repository (the design and spec documents the
  project was first written against, a ``.md`` file, a folder beside the repository, a
  Markdown link that leads nowhere).
- The engine and the API raise their own classes (``jax_backend.errors``: ``CstorchValueError``
  and its kin, each a ``CstorchError`` beside its built-in base), never a bare ``ValueError``,
  ``TypeError``, ``RuntimeError`` or ``NotImplementedError("...")``: ``except CstorchError``
  then sees every refusal of the project. Python's protocols (``KeyError``, ``AttributeError``,
  a bare ``raise NotImplementedError`` of an abstract method) and the operating system's
  conditions (``FileNotFoundError``) keep their built-ins.
"""

from __future__ import annotations

import ast
import functools
import os
import pathlib
import re

from tests.test_import_graph import PACKAGES, ROOT, module_files, resolve_base

# The alias machinery: "module reads other.module._name" -> why. Old names are aliases of new
# ones through tables and properties kept private so that they are not API of their own.
ALLOWED_PRIVATE_READS = {
    "cerebras.modelzoo.trainer.config reads cstorch.optim.config._OPTIMIZER_ALIASES": "the Trainer accepts the old optimizer names the API accepts",
    "cerebras.modelzoo.trainer.config reads cstorch.optim.config._SCHEDULER_ALIASES": "the Trainer accepts the old scheduler names the API accepts",
    "cerebras_pytorch.experimental.optim reads cstorch.optim.config._SCHEDULER_ALIASES": "the 1.8 scheduler names are aliases of the 2.x ones",
    "cstorch.optim.lr_scheduler reads cstorch.optim.scheduler._alias": "the LR schedulers' reference names (initial_learning_rate, ...) alias generic ones",
    "cstorch.backends reads cstorch.utils._flags._flags": "the reference's own (private) base class of cstorch.backends' flag groups",
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
                    elif base in modules and base != name and _is_private(alias.name):
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
        "x = cstorch.a._hidden + alias._hidden + alias.shown\n"
    )
    (tmp_path / "cstorch" / "c.py").write_text("from cstorch import a\nprint(a._hidden)\n")
    import tests.test_import_graph as graph

    monkeypatch.setattr(graph, "ROOT", tmp_path)
    monkeypatch.setattr(graph, "COMPAT_PACKAGES", ())
    monkeypatch.setattr(graph, "PACKAGES", ("cstorch",))
    assert private_reads() == [
        ("cstorch.b", "cstorch.a._hidden"),
        ("cstorch.c", "cstorch.a._hidden"),
    ]


def test_no_module_reads_another_modules_private_names():
    reads = [f"{module} reads {target}" for module, target in private_reads()]
    unexpected = [r for r in reads if r not in ALLOWED_PRIVATE_READS]
    assert not unexpected, (
        "reads of another module's private names (give the name a public spelling in its home "
        "module, or an accessor):\n  " + "\n  ".join(unexpected)
    )
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
    files = sorted(
        p
        for folder in ("examples", "tools")
        for p in (ROOT / folder).iterdir()
        if p.is_file() and not p.name.startswith((".", "__"))
    )
    assert len(files) >= 10
    orphans = [str(p.relative_to(ROOT)) for p in files if p.name not in docs]
    assert not orphans, f"not named in README.md or docs/: {orphans}"


def _documented_transitions(text: str) -> set:
    """(event, from, to) rows of ARCHITECTURE's "legal changes" table. A row may name several
    events; a change annotated ``(event)`` belongs to that one, the others to the first.
    ``a, b -> c`` is two changes; ``a -> b or c`` too."""
    section = text[text.index("| event | when | legal changes |") :]
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
    assert documented == code, (
        f"only in the docs: {sorted(documented - code)}; "
        f"only in jax_backend/state.py: {sorted(code - documented)}"
    )


def test_the_transition_reader_sees_a_wrong_row():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    wrong = text.replace(
        "| share | after a step: memory handed out is still held | stale+lent → stale+shared |",
        "| share | after a step: memory handed out is still held | stale+lent → synced+shared |",
    )
    assert wrong != text
    assert ("share", "stale+lent", "synced+shared") in _documented_transitions(wrong)


# ------------------------------------------------------------------ warnings and stacklevel
# Literal stacklevels above 2 left in files that other work of issue 46 is rewriting now (the
# step's call, the backend's parts, the cache key): "module.function" -> why it still stands.
# Each goes to jax_backend.user_frames.warn when its file is next edited; the test says when an
# entry is stale.
_CACHE_KEY = "the graph cache's key is being reworked (issue 46, item 3)"
ALLOWED_STACKLEVELS = {
    "cstorch.core.capture_cache._guarded": _CACHE_KEY,
    "cstorch.core.capture_cache._load": _CACHE_KEY,
    "jax_backend.program._without_cudnn_after": "the program is being reshaped (issue 46, item 1)",
}


def _warnings_warn_names(tree) -> tuple:
    """The spellings of ``warnings.warn`` in a module: (module aliases, bare names)."""
    modules, names = {"warnings"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "warnings" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "warnings":
            names |= {a.asname or a.name for a in node.names if a.name == "warn"}
    return modules, names


def literal_stacklevels(max_level: int = 2) -> list:
    """``(module.function, level)`` of every ``warnings.warn(..., stacklevel=N)`` with a
    literal ``N > max_level``; ``function`` is the innermost enclosing def (``<module>``)."""
    found = []
    for name, path in module_files().items():
        tree = ast.parse(path.read_text(), str(path))
        spellings = _warnings_warn_names(tree)
        found += [
            (f"{name}.{where}", level)
            for where, level in _stacklevels(tree, spellings)
            if level > max_level
        ]
    return sorted(found)


def _stacklevels(node, spellings: tuple, where: str = "<module>"):
    """``(function, level)`` of the ``warnings.warn`` calls under ``node`` with a literal
    integer ``stacklevel``."""
    for child in ast.iter_child_nodes(node):
        inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
        if isinstance(child, ast.Call) and _is_warn(child.func, *spellings):
            for keyword in child.keywords:
                value = keyword.value
                if (
                    keyword.arg == "stacklevel"
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, int)
                ):
                    yield where, value.value
        yield from _stacklevels(child, spellings, inner)


def _is_warn(func, modules: set, names: set) -> bool:
    if isinstance(func, ast.Name):
        return func.id in names
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "warn"
        and isinstance(func.value, ast.Name)
        and func.value.id in modules
    )


def test_the_stacklevel_rule_sees_every_spelling(tmp_path, monkeypatch):
    (tmp_path / "cstorch").mkdir()
    (tmp_path / "cstorch" / "__init__.py").write_text("")
    (tmp_path / "cstorch" / "a.py").write_text(
        "import warnings\nimport warnings as w\nfrom warnings import warn as say\n"
        "def f():\n    warnings.warn('x', stacklevel=3)\n"
        "    def g():\n        w.warn('y', UserWarning, stacklevel=5)\n"
        "say('z', stacklevel=4)\nwarnings.warn('fine', stacklevel=2)\n"
        "warnings.warn('fine too')\nlevel = 3\nwarnings.warn('not literal', stacklevel=level)\n"
    )
    import tests.test_import_graph as graph

    monkeypatch.setattr(graph, "ROOT", tmp_path)
    monkeypatch.setattr(graph, "COMPAT_PACKAGES", ())
    monkeypatch.setattr(graph, "PACKAGES", ("cstorch",))
    assert literal_stacklevels() == [
        ("cstorch.a.<module>", 4),
        ("cstorch.a.f", 3),
        ("cstorch.a.g", 5),
    ]


def test_no_warning_counts_library_frames_to_reach_the_users_line():
    """A warning about the user's code names the user's line through
    ``jax_backend.user_frames.warn`` (it skips the frames of torch, JAX, the engine and the
    API, however many lie between), never through ``warnings.warn(..., stacklevel=N)`` with
    N > 2: such a count is right only until a call path through the library changes, and then
    points at a library line. ``stacklevel=2`` (the direct caller of a public function) stays
    allowed."""
    found = literal_stacklevels()
    places = {where for where, _ in found}
    unexpected = [
        f"{where}: stacklevel={level}" for where, level in found if where not in ALLOWED_STACKLEVELS
    ]
    assert not unexpected, (
        "warnings.warn with a literal stacklevel above 2 (use jax_backend.user_frames.warn):"
        "\n  " + "\n  ".join(unexpected)
    )
    stale = sorted(set(ALLOWED_STACKLEVELS) - places)
    assert not stale, f"allow-listed stacklevels that no longer exist (remove them): {stale}"


# ------------------------------------------------------------------ references to documents
# Where the project's text may be; tests/data holds the reference's fixtures, quoted as they are.
TEXT_FOLDERS = (
    ".ci",
    "benchmarks",
    "compat",
    "cstorch",
    "docs",
    "examples",
    "jax_backend",
    "tests",
    "tools",
)
TEXT_FILES = ("README.md", "Makefile", "mkdocs.yml", "pyproject.toml")
TEXT_SUFFIXES = (".py", ".md", ".yml", ".yaml", ".toml", ".sh", ".cfg", ".txt")
# Folders beside the repository where the design and the spec once lived: a path into one
# reads as a path of the repository, and is not one.
OUTSIDE_FOLDERS = ("shared", "spec")
# References left in files that other work of issue 46 is rewriting now: "path: reference"
# -> why it still stands.
ALLOWED_OUTSIDE_REFERENCES: dict = {}


def text_files(root) -> list:
    files = [root / name for name in TEXT_FILES if (root / name).is_file()]
    this = pathlib.Path(__file__).resolve()  # the rules' own examples
    for folder in TEXT_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            relative = path.relative_to(root).as_posix()
            if (
                path.is_file()
                and path.suffix in TEXT_SUFFIXES
                and "__pycache__" not in relative
                and not relative.startswith("tests/data/")
                and path.resolve() != this
            ):
                files.append(path)
    return files


_SECTION = re.compile(r"(?P<before>[^\s(]*)\s*§[\w.-]*(?:,\s*§[\w.-]*)*")
_MARKDOWN_NAME = re.compile(r"(?<![\w/.-])((?:\.\./|[\w.-]+/)*[\w.-]+\.md)\b")
_OUTSIDE_PATH = re.compile(
    r"(?<![\w/.-])((?:\.\./)+[\w./-]+|(?:%s)/[\w./-]+)" % "|".join(OUTSIDE_FOLDERS)
)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def outside_references(root) -> list:
    """``"path: reference"`` for every reference in the project's text to a document that
    is not in the repository: a section sign ``§`` not right after the name of one of its
    documents (``DESIGN §10``, ``spec §12``), a ``.md`` file it does not hold, a path into
    a folder beside it (``../shared/spec/DESIGN.md``, ``spec/api_names.json``), and a
    relative Markdown link that leads nowhere."""
    files = text_files(root)
    documents = [p.relative_to(root).as_posix() for p in files if p.suffix == ".md"]
    stems = {os.path.basename(d)[:-3].lower() for d in documents}
    found = []
    for path in files:
        relative = path.relative_to(root).as_posix()
        text = path.read_text(errors="replace")
        exists = functools.partial(_names_a_file, root, path, documents)
        for match in _SECTION.finditer(text):
            before = match.group("before").strip("`'\"*")
            name = os.path.basename(before)
            if name.lower().removesuffix(".md") not in stems:
                found.append(f"{relative}: {before or '(nothing)'} §")
        for match in _MARKDOWN_NAME.finditer(text):
            if not exists(match.group(1)):
                found.append(f"{relative}: {match.group(1)}")
        for match in _OUTSIDE_PATH.finditer(text):
            name = match.group(1).rstrip(".")
            if not ((root / name).exists() or (path.parent / name).exists()):
                found.append(f"{relative}: {name}")
        if path.suffix == ".md":
            for match in _LINK.finditer(text):
                target = match.group(1).split("#")[0]
                if target and not re.match(r"[a-z]+:", target) and not exists(target):
                    found.append(f"{relative}: link {target}")
    return sorted(set(found))


def _names_a_file(root, path, documents: list, name: str) -> bool:
    """Whether ``name``, met in the file at ``path``, is a path from the root or from that
    file's folder, or the end of the path of one of the ``documents``."""
    return (
        (root / name).exists()
        or (path.parent / name).exists()
        or any(d == name or d.endswith("/" + name) for d in documents)
    )


def test_the_reference_rule_sees_each_kind(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "ARCHITECTURE.md").write_text(
        "See ARCHITECTURE §2 and [the readme](../README.md); a [lost page](gone.md#top).\n"
    )
    (tmp_path / "README.md").write_text("The map: docs/ARCHITECTURE.md.\n")
    (tmp_path / "cstorch").mkdir()
    (tmp_path / "cstorch" / "a.py").write_text(
        '"""Two passes (DESIGN §10); the format (spec ``api_inventory.md`` §12, §13).\n'
        'Read ../shared/spec/DESIGN.md and spec/api_names.json, not ARCHITECTURE.md."""\n'
    )
    assert outside_references(tmp_path) == [
        "cstorch/a.py: ../shared/spec/DESIGN.md",
        "cstorch/a.py: DESIGN §",
        "cstorch/a.py: api_inventory.md",
        "cstorch/a.py: api_inventory.md §",
        "cstorch/a.py: spec/api_names.json",
        "docs/ARCHITECTURE.md: gone.md",
        "docs/ARCHITECTURE.md: link gone.md",
    ]


def test_no_reference_to_a_document_outside_the_repository():
    """The design and spec documents the project was first written against are not in the
    repository: a reader cannot follow ``DESIGN §10`` or ``spec §12.2``. Code and docs point
    to a document of the repository (``docs/ARCHITECTURE.md``, the guide, a README) or say
    what they mean in place."""
    found = outside_references(ROOT)
    unexpected = [f for f in found if f not in ALLOWED_OUTSIDE_REFERENCES]
    assert not unexpected, (
        "references to documents that are not in the repository:\n  " + "\n  ".join(unexpected)
    )
    stale = sorted(set(ALLOWED_OUTSIDE_REFERENCES) - set(found))
    assert not stale, f"allow-listed references that no longer exist (remove them): {stale}"


_PROJECT_KINDS = ("ValueError", "TypeError", "RuntimeError", "NotImplementedError")


def bare_builtin_raises() -> list:
    """``"module:line Kind"`` for each raise of one of ``_PROJECT_KINDS`` by its built-in name,
    called with arguments, in the engine and the API (not compat: it raises what the release
    it imitates raised)."""
    found = []
    for name, path in module_files().items():
        if name.split(".")[0] not in PACKAGES:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            exc = node.exc if isinstance(node, ast.Raise) else None
            if (
                isinstance(exc, ast.Call)
                and isinstance(exc.func, ast.Name)
                and exc.func.id in _PROJECT_KINDS
                and (exc.args or exc.keywords)
            ):
                found.append((name, node.lineno, exc.func.id))
    return [f"{name}:{line} {kind}" for name, line, kind in sorted(found)]


def test_the_raise_rule_sees_each_kind_and_leaves_protocols(tmp_path, monkeypatch):
    (tmp_path / "cstorch").mkdir()
    (tmp_path / "cstorch" / "__init__.py").write_text("")
    (tmp_path / "cstorch" / "a.py").write_text(
        "def f(x):\n"
        "    if x:\n        raise ValueError('bad x')\n"
        "    raise TypeError(f'{x}')\n"
        "def g():\n    raise RuntimeError('late')\n"
        "def h():\n    raise NotImplementedError('not modeled')\n"
        "def abstract():\n    raise NotImplementedError\n"
        "def protocol(name):\n    raise AttributeError(name)\n"
        "def ours():\n    raise CstorchValueError('bad')\n"
        "def missing():\n    raise FileNotFoundError(2, 'gone', 'x')\n"
    )
    import tests.test_import_graph as graph

    monkeypatch.setattr(graph, "ROOT", tmp_path)
    monkeypatch.setattr(graph, "COMPAT_PACKAGES", ())
    monkeypatch.setattr(graph, "PACKAGES", ("cstorch",))
    assert bare_builtin_raises() == [
        "cstorch.a:3 ValueError",
        "cstorch.a:4 TypeError",
        "cstorch.a:6 RuntimeError",
        "cstorch.a:8 NotImplementedError",
    ]


def test_the_engine_and_the_api_raise_their_own_error_classes():
    found = bare_builtin_raises()
    assert not found, (
        "raise sites with a bare built-in (raise jax_backend.errors.CstorchValueError, "
        "CstorchTypeError, CstorchRuntimeError or CstorchNotImplementedError instead; each "
        "keeps its built-in base):\n  " + "\n  ".join(found)
    )


if __name__ == "__main__":
    for module, target in private_reads():
        print(module, "->", target)
