"""What a user sees when a step goes wrong: errors name the op, the state and the user's
line; warnings point at the user's line, not at a frame inside cstorch or torch."""

import warnings

import jax.numpy as jnp
import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.core.compile import FrozenValueWarning, RecompilationWarning
from jax_backend import CaptureError, LoweringError, Slot, capture_step
from jax_backend.registry import lowers


# A custom op whose JAX lowering fails, standing in for a buggy lowering.
@torch.library.custom_op("cstorch_test::broken_scale", mutates_args=())
def broken_scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@broken_scale.register_fake
def _(x):
    return torch.empty_like(x)


@lowers(torch.ops.cstorch_test.broken_scale.default)
def _broken_scale_jax(x):
    return jnp.reshape(x, (7,))  # wrong on purpose: raises a TypeError inside JAX


def test_a_failing_lowering_names_the_op_the_node_its_inputs_and_the_user_line():
    compiled = cstorch.compile(torch.nn.Linear(4, 3), cstorch.backend("CPU"))

    @cstorch.trace
    def step(x):
        return broken_scale(compiled(x)).sum()  # the line the error must name

    with pytest.raises(LoweringError) as info:
        step(torch.randn(2, 4))
    message = str(info.value)
    assert "cstorch_test.broken_scale.default" in message
    assert "float32[2, 3]" in message  # the op's input as torch traced it
    assert info.value.node in message and "broken_scale" in info.value.node
    assert "TypeError" in message  # the lowering's own error, kept as the cause
    assert isinstance(info.value.cause, TypeError)
    assert __file__ in message and "return broken_scale(compiled(x)).sum()" in message


def test_rebinding_one_state_tensor_through_two_slots_names_the_slot():
    shared = torch.zeros(3)
    first, second = {"a": shared}, {"b": shared}
    slots = [Slot(first, "a", name="first/a"), Slot(second, "b", name="second/b")]

    def step(x):
        first["a"] = first["a"] + x
        second["b"] = second["b"] * x
        return x

    with pytest.raises(CaptureError, match="second/b was rebound twice"):
        capture_step(step, slots, [torch.ones(3)])
    assert first["a"] is shared and second["b"] is shared  # the slots are restored


def test_updating_a_state_tensor_in_place_and_rebinding_it_names_the_slot():
    holder = {"w": torch.zeros(3)}

    def step(x):
        holder["w"].add_(x)
        holder["w"] = holder["w"] * 2
        return x

    with pytest.raises(CaptureError, match="state 'w' was both modified in place and rebound"):
        capture_step(step, [Slot(holder, "w")], [torch.ones(3)])


def test_backend_state_errors_name_the_state_by_its_path():
    model = torch.nn.Linear(2, 2)
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.param_groups[0]["lr"] = torch.tensor(0.1)

    @cstorch.trace
    def step(x):
        group = optimizer.param_groups[0]
        group["lr"].mul_(0.5)
        group["lr"] = group["lr"] + 0.0
        return compiled(x).sum()

    with pytest.raises(CaptureError, match=r"optimizer0\.group\.0\.lr was both modified"):
        step(torch.ones(1, 2))


# ------------------------------------------------------------------------------ warnings
def _only(record, category):
    matching = [w for w in record if issubclass(w.category, category)]
    assert len(matching) == 1, [str(w.message) for w in record]
    return matching[0]


def test_recompilation_warning_points_at_the_users_call():
    compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))

    @cstorch.trace
    def step(x):
        return compiled(x).sum()

    step(torch.randn(3, 4))
    with pytest.warns(RecompilationWarning) as record:
        step(torch.randn(5, 4))
    assert _only(record, RecompilationWarning).filename == __file__


def test_frozen_value_warning_points_at_the_users_call():
    compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))

    @cstorch.trace
    def step(x, scale):
        return compiled(x).sum() * scale

    step(torch.randn(3, 4), 1.0)
    with pytest.warns(FrozenValueWarning) as record:
        step(torch.randn(3, 4), 2.0)
    assert _only(record, FrozenValueWarning).filename == __file__


def test_in_place_input_update_warning_points_at_the_users_call():
    compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))

    @cstorch.trace
    def step(x):
        x.mul_(2)
        return compiled(x).sum()

    with pytest.warns(UserWarning, match="modifies one of its input tensors") as record:
        step(torch.randn(3, 4))
    assert _only(record, UserWarning).filename == __file__


def test_metric_warning_points_at_the_users_line():
    cstorch.backend("CPU")
    accuracy = cstorch.metrics.AccuracyMetric("accuracy")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        accuracy(labels=torch.tensor([1, 0]), predictions=torch.tensor([[1], [0]]))
    assert _only(record, UserWarning).filename == __file__
