"""Every public name of cerebras-pytorch 2.10 (tests/data/api_names.json) resolves from
``cerebras.pytorch`` with the same parameters (names, kinds, order, default values).

A dotted name resolves by importing its longest importable module prefix and reading the
rest as attributes (``cerebras.pytorch.backend`` is both a function and a module: the
function carries ``.Backend``, ``.BackendType``, ...). Names in ``EXCLUDED`` are CSX-appliance
plumbing this implementation deliberately does not provide.
"""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import json
import typing

import pytest

from tests.reference_data import API_NAMES as SPEC

EXCLUDED = {
    "cerebras.pytorch.backend.ltc_backend.register_before_tensor_to_cpu": "hook around the appliance's device-to-host tensor transfers; no appliance here",
    "cerebras.pytorch.backend.ltc_backend.register_after_tensor_to_cpu": "hook around the appliance's device-to-host tensor transfers; no appliance here",
    "cerebras.pytorch.backend.ltc_backend.ClusterManager.start_workflow": "reserves Wafer-Scale Cluster resources through the cluster management service",
    "cerebras.pytorch.backend.ltc_backend.ClusterManager.stop_workflow": "releases Wafer-Scale Cluster resources through the cluster management service",
    "cerebras.pytorch.backend.ltc_backend.ClusterManager.check_storage_connectivity": "checks the cluster's connectivity to S3 storage from its nodes",
    "cerebras.pytorch.backend.ltc_backend.ClusterManager.active_resources": "queries the resources held by a running cluster workflow",
    "cerebras.pytorch.storage.utils.lazy_tensor_data_wrapper": "unwraps tensors of the appliance's lazy (LTC) device, which does not exist here",
}

with open(SPEC) as _f:
    NAMES = json.load(_f)


def resolve(dotted: str):
    """The object a user reaches as ``dotted``: attributes first (so
    ``cerebras.pytorch.backend`` is the function), importing a submodule only where the
    parent has no such attribute (``cerebras.pytorch.backend.ltc_backend``)."""
    parts = dotted.split(".")
    obj, path = importlib.import_module(parts[0]), parts[0]
    for part in parts[1:]:
        path = f"{path}.{part}"
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(path)
            except ImportError:  # e.g. cerebras.pytorch.backend.backend: the module's member
                obj = getattr(importlib.import_module(path.rsplit(".", 2)[0]), part)
    return obj


def test_resolution_keeps_functions_that_share_a_module_name():
    import cerebras.pytorch as cstorch

    importlib.import_module("cerebras.pytorch.backend.ltc_backend")
    importlib.import_module("cerebras.pytorch.storage.load")
    assert callable(cstorch.backend) and callable(cstorch.storage.load)
    assert resolve("cerebras.pytorch.backend.BackendType") is cstorch.backend.BackendType


def _callable_signature(obj) -> inspect.Signature:
    if isinstance(obj, type):
        if issubclass(obj, enum.Enum) or getattr(obj, "_is_protocol", False):
            return inspect.Signature([])
        for klass in obj.__mro__:
            if klass is object:
                return inspect.Signature([])
            for name in ("__init__", "__new__"):
                if name in vars(klass):
                    return _drop_self(inspect.signature(getattr(klass, name)))
    return _drop_self(inspect.signature(obj))


def _drop_self(signature: inspect.Signature) -> inspect.Signature:
    params = list(signature.parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    return signature.replace(parameters=params)


def parameters(obj) -> list:
    """The parameters in api_names.json's notation: [name, default repr or None]."""
    out, star = [], False
    for p in _callable_signature(obj).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            out.append([f"*{p.name}", None])
            star = True
        elif p.kind is p.VAR_KEYWORD:
            out.append([f"**{p.name}", None])
        else:
            if p.kind is p.KEYWORD_ONLY and not star:
                out.append(["*", None])
                star = True
            out.append([p.name, None if p.default is p.empty else p.default])
    return out


def without_extra_keyword_only(ours: list, expected: list, obj=None) -> list:
    """Drops keyword-only parameters with defaults that the reference lacks: they cannot break
    a call written against the reference (e.g. ``load(..., *, unsafe_allow_pickle=False)``, or
    an older release's keyword such as ``DataExecutor(..., *, listeners=None)``). ``obj``'s
    signature tells a ``None`` default from none (the notation writes both as None)."""
    known = {p[0] for p in expected}
    defaulted = (
        set()
        if obj is None
        else {
            p.name for p in _callable_signature(obj).parameters.values() if p.default is not p.empty
        }
    )
    out, keyword_only = [], False
    for name, default in ours:
        if name == "*" or name.startswith("*") and not name.startswith("**"):
            keyword_only = True
        elif (
            keyword_only
            and not name.startswith("**")
            and name not in known
            and (default is not None or name in defaulted)
        ):
            continue
        out.append([name, default])
    while "*" not in known and out and out[-1][0] == "*":
        out.pop()
    if "*" not in known:
        out = [
            p
            for i, p in enumerate(out)
            if p[0] != "*" or any(not q[0].startswith("**") for q in out[i + 1 :])
        ]
    return out


def same_default(ours, expected: str) -> bool:
    if repr(ours) == expected:
        return True
    try:
        return ours == ast.literal_eval(expected) and type(ours) is type(ast.literal_eval(expected))
    except (ValueError, SyntaxError):
        return False


def test_exclusions_are_few_and_explained():
    assert len(EXCLUDED) < 0.1 * len(NAMES), f"{len(EXCLUDED)} of {len(NAMES)} names excluded"
    assert set(EXCLUDED) <= set(NAMES)
    assert all(reason.strip() for reason in EXCLUDED.values())


@pytest.mark.parametrize("name", sorted(NAMES))
def test_name_resolves_with_reference_parameters(name):
    if name in EXCLUDED:
        pytest.skip(f"excluded: {EXCLUDED[name]}")
    obj = resolve(name)
    expected = NAMES[name]
    ours = without_extra_keyword_only(parameters(obj), expected, obj)
    assert [p[0] for p in ours] == [p[0] for p in expected], (
        f"{name}: parameters {[p[0] for p in ours]} != reference {[p[0] for p in expected]}"
    )
    for (pname, default), (_, ref_default) in zip(ours, expected):
        if ref_default is None:
            assert default is None, (
                f"{name}: `{pname}` has a default ({default!r}); the reference requires it"
            )
        else:
            assert default is not None or ref_default == "None", (
                f"{name}: `{pname}` is required; the reference defaults it to {ref_default}"
            )
            assert same_default(default, ref_default), (
                f"{name}: `{pname}` defaults to {default!r}; the reference to {ref_default}"
            )


def test_star_import_of_every_public_module():
    """``from <module> import *`` works (cerebras-pytorch's metrics.__all__ is broken)."""
    for module in (
        "cerebras.pytorch",
        "cerebras.pytorch.metrics",
        "cerebras.pytorch.nn",
        "cerebras.pytorch.mesh",
        "cerebras.pytorch.utils",
        "cerebras.pytorch.utils.data",
        "cerebras.pytorch.distributed",
        "cerebras.pytorch.profiler",
        "cerebras.pytorch.experimental",
    ):
        namespace: typing.Dict[str, object] = {}
        exec(f"from {module} import *", namespace)  # the behaviour under test
        assert len(namespace) > 1, module
