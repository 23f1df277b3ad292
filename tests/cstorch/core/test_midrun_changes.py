"""Changes between steps take effect as in eager torch, or fail loudly.

Freezing a parameter, registering or removing a tensor or module hook, replacing or untying a
parameter and adding a param group change what eager torch computes from the next step on;
the compiled step must follow (capturing again, with a RecompilationWarning) and give the
losses and weights eager torch gives. On CSX, which cannot recompile, each raises an error
that names what changed. ``copy.deepcopy`` and ``pickle`` of a compiled model give a plain
model with the newest values.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.core.compile import RecompilationWarning
from jax_backend.errors import RecompilationError
from tests.cstorch.core.test_aliases import XS, YS, build
from tests.training import compiled_sgd_step

pytestmark = pytest.mark.core

STEPS = 5
CHANGE_AFTER = 2


def _close(a, b, what, atol=1e-6):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=atol, err_msg=what)


def _run(
    engine,
    change,
    model_kind="mlp",
    optimizer="sgd",
    steps=STEPS,
    changes_at=(CHANGE_AFTER,),
    recompiles_at=(CHANGE_AFTER,),
    after_run=None,
):
    """``change(model, optimizer, when)`` after each step count in ``changes_at``; the
    compiled step must warn that it compiles again at the steps in ``recompiles_at``."""
    cstorch.backend._reset_for_tests()
    model, opt, step = build(engine, model_kind, optimizer)
    losses = []
    for i in range(steps):
        if i in changes_at:
            change(model, opt, i)
            if engine == "cstorch" and i in recompiles_at:
                with pytest.warns(RecompilationWarning):
                    losses.append(step(XS[i], YS[i]).item())
                continue
        losses.append(step(XS[i], YS[i]).item())
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if after_run is not None:
        after_run()
    return losses, state, model, opt, step


def assert_like_eager(change, **options):
    atol = 2e-5 if options.get("optimizer") == "adam" else 1e-6
    ours = _run("cstorch", change, **options)
    eager = _run("eager", change, **options)
    _close(np.array(ours[0]), np.array(eager[0]), "losses", atol)
    assert ours[1].keys() == eager[1].keys()
    for key in eager[1]:
        _close(ours[1][key].numpy(), eager[1][key].numpy(), key, atol)
    return ours, eager


# ------------------------------------------------------------------ requires_grad
def test_freezing_a_layer_between_steps():
    def freeze(model, optimizer, when):
        model[0].weight.requires_grad_(False)

    (_, _, model, _, _), _ = assert_like_eager(freeze)
    assert not model[0].weight.requires_grad


def test_freezing_then_unfreezing_reuses_the_first_program():
    def toggle(model, optimizer, when):
        model[0].weight.requires_grad_(when != CHANGE_AFTER)

    ours, _ = assert_like_eager(toggle, changes_at=(CHANGE_AFTER, CHANGE_AFTER + 1))
    assert ours[4].trace_count == 2


def test_requires_grad_attribute_set_on_a_bias_and_adam():
    def freeze(model, optimizer, when):
        model[3].bias.requires_grad = False

    assert_like_eager(freeze, model_kind="plain", optimizer="adam")


# ------------------------------------------------------------------ hooks
def test_tensor_hook_registered_then_removed_between_steps():
    handles = []

    def change(model, optimizer, when):
        if when == CHANGE_AFTER:
            handles.append(model[0].weight.register_hook(lambda grad: grad * 0.1))
        else:
            handles.pop().remove()

    # Removing it selects the first program again: no third compilation.
    ours, _ = assert_like_eager(change, changes_at=(CHANGE_AFTER, CHANGE_AFTER + 2))
    assert ours[4].trace_count == 2


def _zero_grad_hook(p):
    p.grad.zero_()


def test_parameter_hooks_registered_before_the_first_step():
    """The fake tensors the step is traced with carry the parameters' gradient hooks."""

    def change(model, optimizer, when):
        model[0].weight.register_hook(lambda grad: grad * 0.25)
        model[3].weight.register_post_accumulate_grad_hook(_zero_grad_hook)

    (_, state, *_), _ = assert_like_eager(change, changes_at=(0,), recompiles_at=())
    assert not torch.equal(state["0.weight"], _run("eager", lambda *a: None)[1]["0.weight"])


def test_module_forward_hooks_registered_mid_run():
    def change(model, optimizer, when):
        model[2].register_forward_hook(lambda module, inputs, output: output * 2)
        model[3].register_forward_pre_hook(lambda module, inputs: (inputs[0] + 0.5,))

    assert_like_eager(change)


def test_global_module_forward_hook_registered_mid_run():
    handles = []

    def change(model, optimizer, when):
        handles.append(
            torch.nn.modules.module.register_module_forward_hook(
                lambda module, inputs, output: (
                    output * 0.5 if isinstance(module, torch.nn.Tanh) else None
                )
            )
        )

    def remove():
        while handles:
            handles.pop().remove()

    try:
        assert_like_eager(change, after_run=remove)
    finally:
        remove()


# ------------------------------------------------------------------ replaced parameters
def test_replaced_parameter_gets_no_update_as_in_eager_torch():
    """eager torch: the optimizer keeps the old tensor; the new one is used by the forward
    and never updated, and the old one, no longer used, keeps its value."""

    def replace(model, optimizer, when):
        model[3].weight = torch.nn.Parameter(torch.full((4, 256), 0.01))

    (_, state, _, opt, _), (_, _, _, eager_opt, _) = assert_like_eager(replace)
    assert torch.equal(state["3.weight"], torch.full((4, 256), 0.01))
    old, eager_old = opt.param_groups[0]["params"][4], eager_opt.param_groups[0]["params"][4]
    assert old.shape == (4, 256) and old is not state["3.weight"]
    _close(old.detach().numpy(), eager_old.detach().numpy(), "the optimizer's old weight")


def test_untied_weight_trains_as_in_eager_torch():
    def untie(model, optimizer, when):
        model.again.weight = torch.nn.Parameter(model.mid.weight.detach().clone())

    assert_like_eager(untie, model_kind="tied")


def test_tied_mid_run_as_in_eager_torch():
    def tie(model, optimizer, when):
        model.again.weight = model.mid.weight  # again's own weight stays in the optimizer

    assert_like_eager(tie, model_kind="untied")


# ------------------------------------------------------------------ CSX
@pytest.mark.parametrize(
    "change, named",
    [
        (lambda m: m[0].weight.requires_grad_(False), "requires_grad"),
        (lambda m: m[0].weight.register_hook(lambda g: g), "hook"),
        (lambda m: m[2].register_forward_hook(lambda *a: None), "hook"),
        (lambda m: setattr(m[3], "weight", torch.nn.Parameter(torch.zeros(4, 256))), "replaced"),
    ],
)
def test_csx_refuses_mid_run_changes_and_names_them(change, named):
    from cstorch.distributed import ClusterConfig

    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(num_csx=1))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 256),
        torch.nn.BatchNorm1d(256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 4),
    )
    optimizer, step = compiled_sgd_step(model, backend)

    step(XS[0], YS[0])
    change(model)
    with pytest.raises(RecompilationError, match=named):
        step(XS[1], YS[1])


# ------------------------------------------------------------------ param groups
def test_add_param_group_then_preinitialize_keeps_adam_moments():
    """The reference's documented way to extend a running optimizer: add_param_group, then
    preinitialize() to create the new group's state. Existing moments must survive, as they
    do in eager torch (compared with torch.optim.Adam, eps=0 so the arithmetic is the same)."""
    results = []
    for engine in ("cstorch", "eager"):
        cstorch.backend._reset_for_tests()
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(128, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)
        )
        head = list(model[2].parameters())
        for p in head:
            p.requires_grad_(False)
        model, opt, step = build(engine, optimizer="adam", model=model)
        # build() registered every parameter; start with the body only, as a fine-tuning
        # script would, then add the head as a new group.
        opt.param_groups[0]["params"] = list(model[0].parameters())
        for p in head:
            opt.state.pop(p, None)
        if engine == "cstorch":
            cstorch.backend()._impl.invalidate_state_view()
        losses = [step(XS[i], YS[i]).item() for i in range(2)]
        for p in head:
            p.requires_grad_(True)
        opt.add_param_group({"params": head, "lr": 0.005})
        if engine == "cstorch":
            opt.preinitialize()
        else:
            for p in head:
                opt.state[p].update(
                    step=torch.tensor(0.0),
                    exp_avg=torch.zeros_like(p),
                    exp_avg_sq=torch.zeros_like(p),
                )
        if engine == "cstorch":
            with pytest.warns(RecompilationWarning):
                losses.append(step(XS[2], YS[2]).item())
        else:
            losses.append(step(XS[2], YS[2]).item())
        losses += [step(XS[i], YS[i]).item() for i in range(3, STEPS)]
        moments = {
            i: opt.state[p]["exp_avg"].detach().clone() for i, p in enumerate(model.parameters())
        }
        results.append((losses, copy.deepcopy(model.state_dict()), moments))
    (ours, ours_state, ours_m), (eager, eager_state, eager_m) = results
    _close(np.array(ours), np.array(eager), "losses", 2e-5)
    for key in eager_state:
        _close(ours_state[key].numpy(), eager_state[key].numpy(), key, 2e-5)
    for i in eager_m:
        _close(ours_m[i].numpy(), eager_m[i].numpy(), f"exp_avg {i}", 2e-5)


# ------------------------------------------------------------------ copies
def _trained():
    model, optimizer, step = build("cstorch")
    for i in range(3):
        step(XS[i], YS[i])
    return model, optimizer, step


def test_deepcopy_of_a_compiled_model_is_a_plain_independent_model():
    model, optimizer, step = _trained()
    duplicate = copy.deepcopy(model)
    newest = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert all(type(p) is torch.nn.Parameter for p in duplicate.parameters())
    for key, value in duplicate.state_dict().items():
        assert torch.equal(value, newest[key]), key
    before = {k: v.clone() for k, v in duplicate.state_dict().items()}
    step(XS[3], YS[3])  # training the original leaves the copy alone ...
    for key, value in duplicate.state_dict().items():
        assert torch.equal(value, before[key]), key
    with torch.no_grad():
        duplicate[0].weight.zero_()  # ... and the copy's edits leave the original alone
    assert not torch.equal(model[0].weight, torch.zeros(256, 128))
    out = duplicate(XS[0])  # the copy is an ordinary eager model
    eager = copy.deepcopy(before)
    reference = torch.nn.Sequential(
        torch.nn.Linear(128, 256),
        torch.nn.BatchNorm1d(256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 4),
    )
    eager["0.weight"] = torch.zeros(256, 128)
    reference.load_state_dict(eager)
    torch.testing.assert_close(out, reference(XS[0]))


def test_pickle_of_a_compiled_model_round_trips_to_a_plain_model():
    model, optimizer, step = _trained()
    newest = {k: v.detach().clone() for k, v in model.state_dict().items()}
    restored = pickle.loads(pickle.dumps(model))
    assert all(type(p) is torch.nn.Parameter for p in restored.parameters())
    for key, value in restored.state_dict().items():
        assert torch.equal(value, newest[key]), key
    step(XS[3], YS[3])
    assert torch.equal(restored.state_dict()["0.weight"], newest["0.weight"])
    # `apply` still applies a function to every module (not torch's Module._apply)
    seen = []
    restored.apply(lambda module: seen.append(type(module).__name__))
    assert seen == ["Linear", "BatchNorm1d", "Tanh", "Linear", "Sequential"]
