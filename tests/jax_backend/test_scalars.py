"""Runtime scalars (``jax_backend.scalars``): Python floats a step reads become inputs of its
program, read at every call, instead of constants frozen into the graph.

A torch optimizer's step captured with its param group's floats as scalar slots gives eager
torch's numbers for values other than those it was traced with; what the step's Python code
decides on a float (``if weight_decay != 0``) is reported as a dependency on its sign, and a
dependency on its exact value as such; a Python number the step computes from a scalar is an
output; a scalar promotes as a Python number does; the graph cache keeps all of it.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from jax_backend import Program, Slot, capture_step, dtypes, graph_cache, scalars
from jax_backend.errors import CaptureError
from jax_backend.scalars import ScalarSlot


def _adamw(weight_decay=0.1):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3))
    optimizer = torch.optim.AdamW(
        [w], lr=0.01, betas=(0.9, 0.99), weight_decay=weight_decay, foreach=True, capturable=True
    )
    return w, optimizer


def _compiler_path():
    """torch's optimizers take their compiler path (as a compiled step's capture makes them)."""

    class Flag:
        def __enter__(self):
            self.saved = torch.compiler._is_compiling_flag
            torch.compiler._is_compiling_flag = True

        def __exit__(self, *exc):
            torch.compiler._is_compiling_flag = self.saved

    return Flag()


def _train(w, optimizer, x):
    optimizer.zero_grad()
    loss = (w * x).pow(2).sum()
    loss.backward()
    with _compiler_path():
        optimizer.step()
    return loss


def _group_slots(group) -> list:
    return [
        ScalarSlot(group, "lr", name="lr"),
        ScalarSlot(group, "betas", 0, name="beta1"),
        ScalarSlot(group, "betas", 1, name="beta2"),
        ScalarSlot(group, "weight_decay", name="weight_decay"),
        ScalarSlot(group, "eps", name="eps"),
    ]


def _captured_adamw():
    """An AdamW step after one eager step (its state exists), captured with its group's
    floats as scalars; the optimizer and parameter it was captured over."""
    w, optimizer = _adamw()
    _train(w, optimizer, torch.ones(4, 3))
    state = optimizer.state[w]
    holders = {"w": w, **state}
    slots = [Slot(holders, k, k) for k in ("w", "step", "exp_avg", "exp_avg_sq")]
    group = optimizer.param_groups[0]
    captured = capture_step(
        lambda x: _train(w, optimizer, x),
        slots,
        [torch.ones(4, 3)],
        scalar_slots=_group_slots(group),
    )
    return captured, w, optimizer, [holders[k] for k in ("w", "step", "exp_avg", "exp_avg_sq")]


def test_a_torch_optimizer_step_reads_its_floats_at_every_call():
    captured, w, optimizer, state = _captured_adamw()
    assert captured.used_scalars == [0, 1, 2, 3, 4]
    kinds = dict(captured.scalar_kinds)
    assert kinds.pop(3) == scalars.SIGN  # `if weight_decay != 0` in torch
    # torch 2.9's capturable AdamW reads its betas' exact values (the engine then compiles
    # them as constants, and a new value as another program); newer torch reads them as
    # inputs, like the lr.
    assert kinds in ({}, {1: scalars.VALUE, 2: scalars.VALUE})
    betas_are_inputs = not kinds
    program = Program(captured)
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    for lr, beta1, weight_decay in [
        (0.01, 0.9, 0.1),
        (0.3, 0.5 if betas_are_inputs else 0.9, 0.02),
    ]:
        reference_w, reference = copy.deepcopy((w, optimizer))
        group = reference.param_groups[0]
        group.update(lr=lr, betas=(beta1, 0.99), weight_decay=weight_decay)
        expected = _train(reference_w, reference, x)
        arrays = [dtypes.tensor_to_array(t) for t in state]
        new_state, (loss,) = program(
            [arrays[i] for i in captured.used_state],
            [dtypes.tensor_to_array(x), lr, beta1, 0.99, weight_decay, 1e-8],
        )
        np.testing.assert_allclose(np.asarray(loss), expected.item(), rtol=1e-6)
        written = dict(zip(captured.written_state, new_state))
        np.testing.assert_allclose(
            np.asarray(written[0]), reference_w.detach().numpy(), rtol=1e-6, atol=1e-7
        )


def _kinds(fn, values, x=None):
    """``fn(x, *scalars)`` captured with ``values`` in scalar slots."""
    holder = {f"s{i}": v for i, v in enumerate(values)}
    slots = [ScalarSlot(holder, f"s{i}") for i in range(len(values))]
    x = torch.ones(3) if x is None else x
    return capture_step(
        lambda x: fn(x, *[holder[f"s{i}"] for i in range(len(values))]), [], [x], scalar_slots=slots
    )


def test_what_the_python_code_decides_on_a_scalar_is_reported():
    def step(x, a, b, c, unused):
        y = x * 2.0
        if a != 0:  # decided by the sign
            y = y * a
        if b > 0:  # so is this
            y = y + b
        if c == 0.5:  # the exact value
            y = y - 1
        return y

    captured = _kinds(step, [0.3, 2.0, 0.5, 7.0])
    assert captured.scalar_kinds == {0: scalars.SIGN, 1: scalars.SIGN, 2: scalars.VALUE}
    assert captured.used_scalars == [0, 1]  # c decided a branch only; unused is not read
    program = Program(captured)
    _, (out,) = program([], [np.ones(3, np.float32), 0.25, 3.0])
    np.testing.assert_allclose(np.asarray(out), [2 * 0.25 + 3.0 - 1] * 3, rtol=1e-6)


def test_a_python_number_computed_from_a_scalar_is_an_output():
    captured = _kinds(lambda x, a: (x.sum(), a * 2 + 1), [0.5])
    assert captured.scalar_outputs == [1]
    program = Program(captured)
    _, (total, number) = program([], [np.ones(3, np.float32), 4.0])
    assert float(number) == 9.0 and float(total) == 3.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_scalar_promotes_as_a_python_number(dtype):
    """A Python float scaling a tensor keeps the tensor's dtype: a runtime scalar must give
    what the same float gives as a constant of the graph (not promote to its own 64 bits),
    and in float32 what torch gives."""
    x = torch.tensor([1.0, 3.0, -7.5, 0.1], dtype=dtype)
    holder = {"a": 0.3}

    def step(x):
        a = holder["a"]
        return x * a, x.add(x, alpha=a), x - (1 - a)

    results = []
    for symbolic in (None, []):  # a runtime input, then a constant
        captured = capture_step(
            step, [], [x], scalar_slots=[ScalarSlot(holder, "a")], symbolic=symbolic
        )
        _, outputs = Program(captured)(
            [], [dtypes.tensor_to_array(x)] + ([0.3] if captured.used_scalars else [])
        )
        assert all(out.dtype == dtypes.to_jax_dtype(dtype) for out in outputs)
        results.append([dtypes.array_to_tensor(out) for out in outputs])
    for runtime, constant, eager in zip(*results, step(x)):
        torch.testing.assert_close(runtime, constant, rtol=0, atol=0)
        if dtype == torch.float32:
            torch.testing.assert_close(runtime, eager, rtol=0, atol=0)


def test_a_step_that_sets_a_scalar_in_python_is_refused():
    holder = {"lr": 0.1}

    def step(x):
        holder["lr"] = holder["lr"] * 0.5  # would happen once, when traced
        return x * holder["lr"]

    with pytest.raises(CaptureError, match="sets 'lr' in Python"):
        capture_step(step, [], [torch.ones(2)], scalar_slots=[ScalarSlot(holder, "lr")])
    assert holder == {"lr": 0.1}


def test_scalars_not_made_symbolic_are_constants():
    captured = _kinds(lambda x, a: x * a, [0.5])
    assert captured.used_scalars == [0]
    holder = {"a": 0.5}
    constant = capture_step(
        lambda x: x * holder["a"],
        [],
        [torch.ones(2)],
        scalar_slots=[ScalarSlot(holder, "a")],
        symbolic=[],
    )
    assert constant.used_scalars == [] and constant.scalar_kinds == {}


def test_the_graph_cache_keeps_a_steps_scalars(tmp_path):
    captured, w, optimizer, state = _captured_adamw()
    key = "cd" * 32
    assert graph_cache.store(str(tmp_path), key, captured, {})
    x = torch.ones(4, 3)
    entry = graph_cache.load(str(tmp_path), key, state, [x])
    assert entry is not None
    loaded = entry.captured
    assert loaded.used_scalars == captured.used_scalars
    assert loaded.scalar_kinds == captured.scalar_kinds
    assert loaded.scalar_outputs == captured.scalar_outputs
    inputs = [dtypes.tensor_to_array(x), 0.2, 0.8, 0.95, 0.05, 1e-6]
    results = []
    for c in (captured, loaded):
        arrays = [dtypes.tensor_to_array(t) for t in state]  # (a run donates them)
        new_state, outputs = Program(c)([arrays[i] for i in c.used_state], inputs)
        results.append([np.asarray(a) for a in list(new_state) + list(outputs)])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
