"""The supported torch/JAX range (issue 25): differences between releases are found by
feature, and ``make`` keeps a user's torch inside the range.

The oldest and newest releases themselves run the suite in CI (``make test-compat``,
``make test-newest``, beside ``make test``); these tests pin the decisions with stand-ins for
the other releases."""

from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch
from torch.utils import _pytree as pytree

from cstorch.distributed import runtime
from cstorch.utils import nest
from jax_backend import torch_versions
from tests.paths import REPO as ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
import ensure_torch

pytestmark = pytest.mark.core


class _Torch29Spec:
    """A ``TreeSpec`` as torch 2.9 has it: the ``children_specs`` field, no ``children()``."""

    def __init__(self, spec):
        self.type, self.context, self.num_leaves = spec.type, spec.context, spec.num_leaves
        self.children_specs = [_Torch29Spec(c) for c in torch_versions.treespec_children(spec)]


def test_treespec_children_on_this_torch_and_on_torch_2_9():
    _, spec = pytree.tree_flatten({"a": [1, 2], "b": (3,)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 2.13 deprecates children_specs with a FutureWarning
        children = torch_versions.treespec_children(spec)
    assert [c.type for c in children] == [list, tuple]
    old = _Torch29Spec(spec)
    assert not hasattr(old, "children")
    assert [c.type for c in torch_versions.treespec_children(old)] == [list, tuple]
    assert list(nest.recurse_spec(old)) == [["a", "0"], ["a", "1"], ["b", "0"]]
    assert list(nest.recurse_spec(spec)) == [["a", "0"], ["a", "1"], ["b", "0"]]


def _jax_06_initialize(
    coordinator_address=None,
    num_processes=None,
    process_id=None,
    local_device_ids=None,
    cluster_detection_method=None,
    initialization_timeout=300,
    coordinator_bind_address=None,
    slice_index=None,
):
    """``jax.distributed.initialize``'s signature in JAX 0.6 (no heartbeat or shutdown
    timeouts)."""


def _jax_07_initialize(
    coordinator_address=None,
    num_processes=None,
    process_id=None,
    local_device_ids=None,
    cluster_detection_method=None,
    initialization_timeout=300,
    heartbeat_timeout_seconds=100,
    shutdown_timeout_seconds=300,
    coordinator_bind_address=None,
):
    """... and from JAX 0.7."""


def test_distributed_timeouts_follow_what_initialize_accepts():
    wanted = runtime.DistributedConfig("127.0.0.1:5", 2, 0, heartbeat_timeout=7)
    assert runtime._runtime_timeouts(_jax_07_initialize, wanted) == {
        "heartbeat_timeout_seconds": 7,
        "shutdown_timeout_seconds": 10,
    }
    with pytest.warns(UserWarning, match="cannot set the heartbeat timeout"):
        assert runtime._runtime_timeouts(_jax_06_initialize, wanted) == {}
    default = runtime.DistributedConfig("127.0.0.1:5", 2, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing asked for: nothing to warn about
        assert runtime._runtime_timeouts(_jax_06_initialize, default) == {}


def test_the_declared_torch_range():
    assert ensure_torch.supported_range() == ">=2.9,<2.16"
    assert ensure_torch.in_range(torch.__version__, ensure_torch.supported_range())
    for version, ok in [
        ("2.9.0", True),
        ("2.9.1+cu128", True),
        ("2.13.0+cpu", True),
        ("2.14.1", True),
        ("2.15.0", True),
        ("2.15.0+cu132", True),
        ("2.15.1rc1", True),
        ("2.8.0", False),
        ("2.16.0", False),
        ("2.16.0.dev20270101+cpu", False),
        ("3.0", False),
    ]:
        assert ensure_torch.in_range(version, ">=2.9,<2.16") is ok, version
    # packaging's PEP 440 rules, not a prefix of release numbers: 2.9.0.post1 is in, and a
    # version string that is not one is an error, never a silent "in range".
    assert ensure_torch.in_range("2.9.0.post1", ">=2.9,<2.16")
    with pytest.raises(ValueError):
        ensure_torch.in_range("not-a-version", ">=2.9,<2.16")


def test_the_declared_ranges_cover_the_newest_tested_stack():
    """The range pip sees: torch 2.15 and JAX 0.12 (the newest leg, ``make test-newest``) and
    torch 2.9 / JAX 0.7 (``make test-compat``) are inside it, so ``pip install -e .`` keeps
    them; numpy 1.26 and 2.x too."""
    import declared_range

    for package, inside, outside in [
        ("torch", ["2.9.0", "2.15.0+cu132"], ["2.8.0", "2.16.0"]),
        ("jax", ["0.7.0", "0.12.0.1"], ["0.6.2", "0.13.0"]),
        ("numpy", ["1.26.4", "2.5.5"], ["1.25.2", "3.0.0"]),
    ]:
        spec = declared_range.declared_range(package)
        assert all(declared_range.allows(spec, v) for v in inside), (package, spec)
        assert not any(declared_range.allows(spec, v) for v in outside), (package, spec)


@pytest.mark.parametrize(
    "installed, status, installs", [("2.14.1", 0, False), (None, 0, True), ("2.7.1", 2, False)]
)
def test_make_keeps_a_torch_in_range_and_never_replaces_one(
    monkeypatch, capsys, installed, status, installs
):
    calls = []
    monkeypatch.setattr(ensure_torch, "installed_torch", lambda: installed)
    monkeypatch.setattr(ensure_torch.subprocess, "call", lambda command: calls.append(command) or 0)
    assert ensure_torch.main(["2.13.0"]) == status
    assert bool(calls) is installs
    if installs:
        assert calls[0][-1] == "torch==2.13.0"
    if status == 2:
        assert "outside the supported range" in capsys.readouterr().err


@pytest.mark.slow
def test_every_jax_name_the_project_uses_exists_in_this_jax():
    import ast

    import jax_names

    names, optional = jax_names.project_names()
    assert len(names) > 200 and "jax.numpy.where" in names and "jax.export.export" in names
    # a fallback for releases without a name counts as optional (jax.enable_x64 came in 0.8)
    assert "jax.experimental.enable_x64" in names and "jax.experimental.enable_x64" in optional
    missing = sorted(n for n in names if n not in optional and not jax_names.resolves(n))
    assert not missing
    # ... and the checker does see a name that is not there, and a feature check.
    snippet = (
        "import jax.numpy as jnp\nfrom jax import lax\njnp.no_such_function(1)\n"
        "f = lax.top_k if hasattr(lax, 'no_such_op') else None\n"
    )
    used, guarded = jax_names.names_in(ast.parse(snippet))
    assert {"jax.numpy.no_such_function", "jax.lax.top_k"} <= used
    assert guarded == {"jax.lax.no_such_op"}
    assert not jax_names.resolves("jax.numpy.no_such_function")
    assert jax_names.resolves("jax.lax.top_k")
    # ... and none the project needs is deprecated in this JAX (JAX 0.12 moved jax.core and
    # pxla names to jax.extend: reaching the old ones warns).
    deprecated = sorted(n for n in names if n not in optional and jax_names.deprecation(n))
    assert not deprecated


def test_jax_names_sees_a_deprecated_name(monkeypatch):
    """A module that warns on an attribute, as JAX's deprecation ``__getattr__`` does."""
    import types

    import jax_names

    module = types.ModuleType("jax.i33_stand_in")

    def __getattr__(name):
        if name == "old":
            warnings.warn(
                "jax.i33_stand_in.old is deprecated; use jax.extend.new",
                DeprecationWarning,
                stacklevel=2,
            )
            return 1
        raise AttributeError(name)

    module.__getattr__ = __getattr__
    module.new = 2
    monkeypatch.setitem(sys.modules, "jax.i33_stand_in", module)
    assert jax_names.resolves("jax.i33_stand_in.old")
    assert "use jax.extend.new" in jax_names.deprecation("jax.i33_stand_in.old")
    assert jax_names.deprecation("jax.i33_stand_in.new") is None
    assert jax_names.deprecation("jax.i33_stand_in.missing") is None


def test_source_torch_generates_in_a_temporary_directory_is_torchs(monkeypatch, tmp_path):
    """torch 2.9 writes a module into a new temporary directory at each import of
    torch.distributed.nn: the graph cache must count it as torch's code, not as a user file
    that appeared (which made every second run miss)."""
    import types

    from jax_backend.graph_cache import fingerprint

    generated = str(tmp_path / "_remote_module_non_scriptable.py")
    assert not fingerprint.is_library_file(generated)
    monkeypatch.setitem(
        sys.modules,
        "torch.distributed.nn.jit.instantiator",
        types.SimpleNamespace(_TEMP_DIR=types.SimpleNamespace(name=str(tmp_path))),
    )
    assert torch_versions.generated_source_dirs() == (str(tmp_path) + os.sep,)
    assert fingerprint.is_library_file(generated)
    assert not fingerprint.is_library_file(str(tmp_path) + "-other/user.py")


@pytest.mark.skipif(
    os.environ.get("CSTORCH_TEST_DEPRECATIONS") != "error",
    reason="the newest leg (make test-newest) turns deprecations into errors",
)
def test_a_deprecation_in_the_projects_code_fails_the_newest_leg():
    """What JAX's own CI does: a DeprecationWarning (or FutureWarning) raised from the
    project's modules is an error; one from torch, JAX or a test is not."""

    def warn_from(module, category):
        exec(
            "import warnings\nwarnings.warn('old API', category)",
            {"__name__": module, "category": category},
        )

    for module in ("jax_backend.export", "cstorch.nn", "cerebras.modelzoo.trainer"):
        for category in (DeprecationWarning, FutureWarning):
            with pytest.raises(category, match="old API"):
                warn_from(module, category)
    # The leg's rule alone (the suite's own "error" for every warning aside): it names the
    # project's modules only.
    from tests.conftest import PROJECT_MODULES

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("error", category=DeprecationWarning, module=PROJECT_MODULES)
        for module in ("torch.nn", "jax.numpy", "tests.cstorch.test_export", "cstorchy"):
            warn_from(module, DeprecationWarning)
        with pytest.raises(DeprecationWarning):
            warn_from("cstorch.nn", DeprecationWarning)
    assert len(caught) == 4
