"""No dead code: every function, method, property and class that ``cstorch/`` or
``jax_backend/`` defines is named somewhere else in the repository (the packages, ``compat/``,
tests, tools, examples, benchmarks), in the manner of ``vulture``.

A name counts as used wherever it is read: a name or an attribute, an import, a keyword, or a
string that is exactly the name (``getattr(obj, "name")``, ``__all__``). That is coarse on
purpose (a method is alive while any other method of the same name is called), so it never
calls live code dead; what it finds is dead. Left out: dunders, what a decorator registers
(``@lowers(...)``, ``@torch.library.custom_op``: the registry calls it), and cerebras-pytorch
2.10's own API (``tests/data/api_names.json``), which scripts outside the repository call.
``compat/`` is all API of older releases for code outside the repository, so its definitions
are not checked (its uses count).

What stays although nothing here calls it is listed below with the reason.
"""

from __future__ import annotations

import ast
import json

import pytest

from tests.test_import_graph import ROOT

DEFINING = ("cstorch", "jax_backend")
USING = (*DEFINING, "compat", "tests", "tools", "examples", "benchmarks")
# Decorators that leave a function where it was defined (anything else may register it).
PLAIN_DECORATORS = {
    "property",
    "setter",
    "staticmethod",
    "classmethod",
    "cached_property",
    "abstractmethod",
    "contextmanager",
    "wraps",
}

REFERENCE_API = "cerebras-pytorch 2.10's API (not in the name inventory), for users' scripts"
ALLOWED = {
    # cerebras-pytorch 2.10's API that the inventory of public names leaves out
    "cstorch/core/device.py: move_to_device": REFERENCE_API,
    "cstorch/lib/cerebras_pytorch_lib.py: enable_annotation": REFERENCE_API,
    "cstorch/lib/cerebras_pytorch_lib.py: disable_annotation": REFERENCE_API,
    "cstorch/sparse/base.py: csx_annotate_sparsity": "a SparsityAlgorithm hook of " + REFERENCE_API,
    "cstorch/sparse/dynamic.py: csx_annotate_sparsity": "a SparsityAlgorithm hook of "
    + REFERENCE_API,
    "cstorch/sparse/static.py: csx_annotate_sparsity": "a SparsityAlgorithm hook of "
    + REFERENCE_API,
    "cstorch/sparse/base.py: disable_mask_access_warning": REFERENCE_API,
    "cstorch/storage/deferred.py: register_post_materialize_hook": REFERENCE_API,
    "cstorch/utils/data/data_executor.py: is_activation_step": "RunContext's, " + REFERENCE_API,
    "cstorch/utils/nest.py: visit_device_tensors": REFERENCE_API,
    "cstorch/utils/nest.py: visit_lazy_tensors": REFERENCE_API,
    "cstorch/utils/step_closures.py: RepeatStepClosure": REFERENCE_API,
    "cstorch/utils/tensorboard/writer.py: utctime": "TensorDescriptor's, " + REFERENCE_API,
    "cstorch/utils/tensorboard/writer.py: scalar_groups": "SummaryReader's, " + REFERENCE_API,
    # a protocol another library calls by name
    "cstorch/storage/h5_format.py: readable": "io.RawIOBase's, which h5py reads through",
    "cstorch/storage/h5_format.py: writable": "io.RawIOBase's, which h5py writes through",
    "cstorch/storage/h5_format.py: seekable": "io.RawIOBase's, which h5py seeks through",
    "cstorch/storage/h5_format.py: readinto": "io.RawIOBase's, which h5py reads through",
    "cstorch/storage/h5_format.py: truncate": "io.RawIOBase's, which h5py truncates through",
}


def _decorator_name(node) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _python_files(folders):
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def _definitions(tree):
    """The functions and classes of a module's or class's body, and those of the classes in
    it (any depth)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield node
            yield from _definitions(node)


def _used_names(tree) -> set:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.update({node.name.rpartition(".")[2], node.asname or ""})
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.isidentifier()
        ):
            names.add(node.value)
    return names


def unused_definitions(reference_api: set) -> list:
    """``"path: name"`` of every definition in ``DEFINING`` whose name nothing reads."""
    used, definitions = set(), []
    for path in _python_files(USING):
        tree = ast.parse(path.read_text(), str(path))
        used |= _used_names(tree)
        relative = path.relative_to(ROOT).as_posix()
        if relative.split("/")[0] in DEFINING:
            definitions += [(relative, node) for node in _definitions(tree)]
    unused = []
    for relative, node in definitions:
        name = node.name
        if (
            name in used
            or (name.startswith("__") and name.endswith("__"))
            or (relative.startswith("cstorch/") and name in reference_api)
            or any(_decorator_name(d) not in PLAIN_DECORATORS for d in node.decorator_list)
        ):
            continue
        unused.append(f"{relative}: {name}")
    return sorted(set(unused))


def _reference_api() -> set:
    names = json.loads((ROOT / "tests" / "data" / "api_names.json").read_text())
    return {name.rpartition(".")[2] for name in names}


def test_the_check_finds_a_function_nothing_calls(tmp_path, monkeypatch):
    import tests.test_dead_code as check

    (tmp_path / "cstorch").mkdir()
    (tmp_path / "cstorch" / "a.py").write_text(
        "import functools\n"
        "def called(): pass\n"
        "def dead(): pass\n"
        "def by_name(): pass\n"
        "@functools.lru_cache\ndef registered(): pass\n"
        "class Holder:\n"
        "    @property\n    def dead_property(self): pass\n"
        "    def __len__(self): return 0\n"
        "    def api_method(self): pass\n"
        "called(); getattr(Holder, 'by_name')\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("from cstorch.a import Holder\n")
    monkeypatch.setattr(check, "ROOT", tmp_path)
    monkeypatch.setattr(check, "USING", ("cstorch", "tests"))
    assert unused_definitions({"api_method"}) == [
        "cstorch/a.py: dead",
        "cstorch/a.py: dead_property",
    ]


@pytest.mark.slow  # reads every Python file of the repository: about 3 s
def test_no_function_method_or_class_is_dead():
    found = unused_definitions(_reference_api())
    unexpected = [f for f in found if f not in ALLOWED]
    assert not unexpected, (
        "defined but never used anywhere in the repository (remove it, or list it in ALLOWED "
        "with the reason it stays):\n  " + "\n  ".join(unexpected)
    )
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"listed in ALLOWED but used now, or gone (remove them): {stale}"
