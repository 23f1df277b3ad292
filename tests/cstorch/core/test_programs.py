"""The program table's signature and the persistent graph cache's key are one definition of
"what selects a program": every ``ProgramSignature`` field has a persistent rendering, and a
change in any single field changes the cache key (else a new field could be forgotten in the
key, and a run would load a stale graph)."""

from __future__ import annotations

import json
import os
from typing import NamedTuple

import pytest
import torch
from torch.utils import _pytree as pytree

import cstorch
import jax_backend
from cstorch.core import programs
from cstorch.core.capture_cache import CaptureCache
from cstorch.core.compile import TracedStep
from cstorch.core.programs import ProgramSignature, persistent_signature
from cstorch.core.step_call import StepCall
from cstorch.decomp.registry import decompositions_for
from jax_backend import graph_cache
from jax_backend.graph_cache.fingerprint import Fingerprinter
from tests.training import minimizing

pytestmark = pytest.mark.core  # the cache key's tie to the signature: every stack

_, SPEC = pytree.tree_flatten(((torch.ones(2, 3),), {}))
_, OTHER_SPEC = pytree.tree_flatten(((torch.ones(2, 3),), {"mask": torch.ones(2, 3)}))

BASE = ProgramSignature(
    input_structure=SPEC,
    input_shapes_dtypes=(((2, 3), torch.float32),),
    train_eval_modes=((True, True),),
    grad_mode=True,
    precision_policy=jax_backend.Policy(),
    requires_grad=(True, True),
    parameter_hooks=((0, (12,), ()),),
    module_hooks=((0, 1, (), (40,), (), ()), ("torch global", 1, (41,))),
    gradients_held=(False, False),
)

# One change per field, each a change that selects another program in memory.
VARIANTS = {
    "input_structure": [OTHER_SPEC],
    "input_shapes_dtypes": [(((4, 3), torch.float32),), (((2, 3), torch.bfloat16),), (None,)],
    "train_eval_modes": [((True, False),), ((True, True), (False,))],
    "grad_mode": [False],
    "precision_policy": [jax_backend.Policy("bfloat16"), jax_backend.Policy(float32_matmul="high")],
    "requires_grad": [(True, False)],
    "parameter_hooks": [(), ((1, (12,), ()),), ((0, (), (12,)),), ((0, (12, 13), ()),)],
    "module_hooks": [
        ((0, 1, (), (40,), (), ()),),  # the global hook removed
        ((0, 2, (), (40,), (), ()), ("torch global", 1, (41,))),
        ((0, 1, (40,), (), (), ()), ("torch global", 1, (41,))),
        ((0, 1, (), (40,), (), ()), ("torch global", 2, (41,))),
    ],
    "gradients_held": [(False, True)],
}


def _cache_key(signature: ProgramSignature) -> str:
    return graph_cache.step_key(Fingerprinter(), [], [], persistent_signature(signature), {}, "")


def test_every_signature_field_has_a_persistent_rendering_of_plain_data():
    rendered = persistent_signature(BASE)
    assert list(rendered) == list(ProgramSignature._fields)
    assert json.loads(json.dumps(rendered)) == rendered  # plain data, as the key hashes it
    assert set(VARIANTS) == set(ProgramSignature._fields), "give a new field a variant here"


def test_a_field_without_a_rendering_is_refused(monkeypatch):
    """What happens to a field added to ``ProgramSignature`` but not to the renderings."""

    class Extended(NamedTuple):
        input_structure: object
        new_field: int

    monkeypatch.setattr(programs, "ProgramSignature", Extended)
    with pytest.raises(TypeError, match="new_field"):
        persistent_signature(Extended(SPEC, 1))


@pytest.mark.parametrize(
    "field, value",
    [(f, v) for f, vs in VARIANTS.items() for v in vs],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_a_change_in_any_single_field_changes_the_cache_key(field, value):
    changed = BASE._replace(**{field: value})
    assert changed != BASE  # the program table tells them apart ...
    assert _cache_key(changed) != _cache_key(BASE)  # ... and so does the graph cache


def test_hooks_render_by_rank_so_another_history_keys_alike():
    """Handle ids count every hook the process ever made; the same hooks registered after
    other ones (another import order, a hook added and removed) must find the entry."""
    later = BASE._replace(
        parameter_hooks=((0, (112,), ()),),
        module_hooks=((0, 1, (), (140,), (), ()), ("torch global", 1, (141,))),
    )
    assert _cache_key(later) == _cache_key(BASE)


@pytest.mark.slow  # each key fingerprints the process (about 1 s)
def test_a_parameter_hook_changes_the_cache_key_of_a_real_step(cpu_backend, tmp_path, monkeypatch):
    """A hook on a parameter changes the gradient, but a parameter is state, which the
    fingerprint names by its place only: the signature's rendering keys the hook's presence,
    the fingerprint of the parameters' hook functions which hook it is."""
    os.chmod(tmp_path, 0o700)
    monkeypatch.setenv("CSTORCH_GRAPH_CACHE", str(tmp_path))
    model = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(model, cpu_backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    step = minimizing(lambda x: compiled(x).sum(), optimizer)

    impl = cpu_backend._impl
    x = torch.ones(4, 2)

    def cache_key():
        leaves, spec = pytree.tree_flatten(((x,), {}))
        view = impl.state_view()
        call = StepCall(impl, tuple(leaves), spec, view)
        cache = CaptureCache(
            impl,
            step,
            leaves,
            programs.signature(call),
            view,
            [x],
            decompositions_for("CPU"),
            traced_step_type=TracedStep,
            trace_hooks=False,
        )
        return cache.key

    before = cache_key()
    assert before is not None  # the step is cacheable
    handle = model.weight.register_hook(lambda grad: grad * 0)
    frozen = cache_key()
    assert frozen not in (None, before)
    handle.remove()
    assert cache_key() == before
    handle = model.weight.register_hook(lambda grad: grad * 2)  # the same place, another hook
    assert cache_key() not in (None, before, frozen)
    handle.remove()
