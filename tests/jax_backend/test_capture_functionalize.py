"""Capture skips its functionalization pass when the traced graph only writes whole state
tensors, and takes the general pass otherwise; both give eager torch's numbers.

Each case runs a step twice on copies of the same state: once eagerly in torch, once captured
and run on JAX. The new state and the outputs must agree, and the test checks which path the
capture took (the fast one must be the common case, the general one must catch aliasing)."""

import copy

import numpy as np
import pytest
import torch

import jax_backend.capture as capture_module
from jax_backend import Program, Slot, capture_step, dtypes
from jax_backend.torch_ops import optimizer_config


def _run_captured(fn, state: dict, inputs):
    slots = [Slot(state, k) for k in state]
    captured = capture_step(fn(state), slots, inputs)
    tensors = [s.get() for s in slots]
    used = [dtypes.tensor_to_array(tensors[i].detach()) for i in captured.used_state]
    new_state, outputs = Program(captured)(used, [dtypes.tensor_to_array(x) for x in inputs], 0)
    result = {k: v.detach().numpy() for k, v in state.items()}
    for index, value in zip(captured.written_state, new_state):
        result[list(state)[index]] = np.asarray(value)
    return result, [np.asarray(o) for o in outputs]


def _check(fn, state, inputs, fast, monkeypatch):
    taken = []
    real = capture_module._simple_writes

    def spy(*args):
        writes = real(*args)
        taken.append(writes is not None)
        return writes

    monkeypatch.setattr(capture_module, "_simple_writes", spy)
    eager_state = copy.deepcopy(state)
    eager_out = fn(eager_state)(*inputs)
    eager_out = eager_out if isinstance(eager_out, (list, tuple)) else [eager_out]
    got_state, got_out = _run_captured(fn, state, inputs)
    assert taken == [fast]
    for name, value in eager_state.items():
        np.testing.assert_allclose(
            got_state[name], value.detach().numpy(), rtol=1e-6, atol=1e-7, err_msg=name
        )
    for got, want in zip(got_out, eager_out):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-6, atol=1e-7)


def _sgd_step(state, in_place_arithmetic=False):
    """A linear model, its backward and an SGD update with momentum, written as whole-tensor
    copies (the shape the project's optimizers and batch norm's running statistics take once
    decomposed) or as in-place arithmetic."""

    def step(x, y):
        w, b, buf = state["w"], state["b"], state["momentum"]
        loss = torch.nn.functional.mse_loss(x @ w.t() + b, y)
        gw, gb = torch.autograd.grad(loss, [w, b])
        with torch.no_grad():
            if in_place_arithmetic:
                buf.mul_(0.9).add_(gw)
                w.sub_(0.1 * buf)
                b.sub_(0.1 * gb)
                state["steps"].add_(1)
            else:
                buf.copy_(buf * 0.9 + gw)
                w.copy_(w - 0.1 * buf)
                b.copy_(b - 0.1 * gb)
                state["steps"].copy_(state["steps"] + 1)
        return loss

    return step


def _training_state():
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(3, 5, generator=g).requires_grad_(),
        "b": torch.randn(3, generator=g).requires_grad_(),
        "momentum": torch.randn(3, 5, generator=g),
        "steps": torch.zeros((), dtype=torch.int64),
    }


@pytest.mark.parametrize("in_place_arithmetic", [False, True])
def test_a_training_step(in_place_arithmetic, monkeypatch):
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(8, 5, generator=g), torch.randn(8, 3, generator=g)]
    _check(
        lambda state: _sgd_step(state, in_place_arithmetic),
        _training_state(),
        inputs,
        True,
        monkeypatch,
    )


def test_batch_norm_running_statistics_skip_the_functionalization_pass(monkeypatch):
    torch.manual_seed(0)
    module = torch.nn.BatchNorm1d(3, momentum=0.3)

    def fn(state):
        def step(x):
            return torch.nn.functional.batch_norm(
                x,
                state["mean"],
                state["var"],
                state["weight"],
                state["bias"],
                training=True,
                momentum=0.3,
            )

        return step

    state = {
        "mean": torch.randn(3),
        "var": torch.rand(3) + 0.5,
        "weight": module.weight.detach().clone(),
        "bias": torch.randn(3),
    }
    _check(fn, state, [torch.randn(6, 3) * 2 + 1], True, monkeypatch)


def test_reads_after_a_write_see_the_new_value(monkeypatch):
    def fn(state):
        def step(x):
            a = state["a"]
            before = a * x
            a.copy_(a * 2 + x)
            after = a.sum()  # the new value
            a.copy_(a - 1)  # written twice: the last write wins
            return before, after, a * 1

        return step

    _check(fn, {"a": torch.arange(4.0)}, [torch.ones(4)], True, monkeypatch)


def test_broadcasting_and_casting_copies(monkeypatch):
    def fn(state):
        def step(x):
            state["counts"].copy_(x.sum() * 3.7)  # float scalar into an int64 vector
            state["row"].copy_(x[0])  # broadcast along the first dimension
            return state["counts"] + 0

        return step

    state = {"counts": torch.zeros(4, dtype=torch.int64), "row": torch.zeros(2, 3)}
    _check(fn, state, [torch.arange(6.0).reshape(2, 3)], True, monkeypatch)


def test_a_view_read_after_its_base_is_written_takes_the_general_pass(monkeypatch):
    def fn(state):
        def step(x):
            flat = state["a"].view(-1)
            state["a"].copy_(state["a"] * x)
            return flat * 1  # aliases `a`: must see the new value

        return step

    _check(
        fn, {"a": torch.arange(6.0).reshape(2, 3)}, [torch.full((2, 3), 2.0)], False, monkeypatch
    )


@pytest.mark.parametrize(
    "write",
    ["intermediate", "alias read later", "clip transposed grad", "index", "slice read alone"],
)
def test_whole_intermediates_written_in_place_skip_the_pass(write, monkeypatch):
    def fn(state):
        def step(x):
            a = state["a"]
            if write == "intermediate":
                t = a * 2
                t.add_(x)
                a.copy_(t)
                return a.sum() + 0
            if write == "index":
                a[torch.tensor([0, 2])] = x[:2]  # index_put_ -> index_put: a whole new `a`
                return a.sum() + 0
            if write == "slice read alone":
                part = (a * x)[1:]
                part.mul_(x[1:])
                return part + 0  # its base is never read again
            if write == "alias read later":
                t = a * 2
                alias = t.detach()
                t.mul_(x)
                return alias + 1  # must see the multiplied value
            w = state["w"]
            (grad,) = torch.autograd.grad((x.reshape(1, 4) @ w.t()).square().sum(), [w])
            with torch.no_grad():
                grad.mul_(0.5)  # grad is the .t() of an intermediate, as clipping writes it
                w.sub_(grad)
            return grad.sum() + 0

        return step

    state = {"a": torch.arange(4.0), "w": torch.arange(12.0).reshape(3, 4).requires_grad_()}
    _check(fn, state, [torch.arange(4.0) + 1], True, monkeypatch)


@pytest.mark.parametrize(
    "write", ["slice", "base read after its view is written", "split", "transpose_"]
)
def test_other_mutations_take_the_general_pass(write, monkeypatch):
    def fn(state):
        def step(x):
            a = state["a"]
            if write == "slice":
                a[1:].mul_(x[1:])
            elif write == "base read after its view is written":
                t = (a * x).reshape(2, 2)
                t.t().add_(1)
                return t + 0
            elif write == "split":
                t = a * x
                t.split(2)[1].mul_(3)
                return t + 0
            else:
                t = (a * x).reshape(2, 2)
                t.transpose_(0, 1)
                return t + 0
            return a.sum() + 0

        return step

    _check(fn, {"a": torch.arange(4.0)}, [torch.full((4,), 3.0)], False, monkeypatch)


def test_gradients_of_a_several_result_op_clipped_in_place_skip_the_pass(monkeypatch):
    """Layer norm's backward is one op with three results (kept whole by the capture): its
    weight's and bias's gradients are fresh tensors, so gradient clipping's in-place scaling
    of them (nanoGPT's `clip_grad_norm_` before AdamW) keeps the fast path."""

    def fn(state):
        def step(x):
            w, b = state["w"], state["b"]
            loss = (torch.nn.functional.layer_norm(x, (5,), w, b) ** 2).mean()
            grads = torch.autograd.grad(loss, [w, b])
            with torch.no_grad():  # clip_grad_norm_'s arithmetic, on the gradients themselves
                norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
                torch._foreach_mul_(list(grads), torch.clamp(0.01 / (norm + 1e-6), max=1.0))
                w.sub_(grads[0])
                b.sub_(grads[1])
            return loss

        return step

    g = torch.Generator().manual_seed(2)
    state = {
        "w": torch.randn(5, generator=g).requires_grad_(),
        "b": torch.randn(5, generator=g).requires_grad_(),
    }
    _check(fn, state, [torch.randn(4, 5, generator=g) * 3], True, monkeypatch)


def _optimizer_update_step(state, written_out, view_read_after=False):
    """A linear model's backward and SGD with momentum, as the project's optimizers write it
    (one ``cstorch::optimizer_update`` node writing the parameters and buffers in place, which
    the capture expands into ``optimizer_step`` and a copy per tensor), or written out in torch
    ops (the reference). ``view_read_after``: a view of a parameter, taken before the update,
    is read after it, which only the general functionalization pass handles."""

    def step(x, y):
        w, b = state["w"], state["b"]
        flat = w.view(-1)
        loss = torch.nn.functional.mse_loss(x @ w.t() + b, y)
        gw, gb = torch.autograd.grad(loss, [w, b])
        params, grads, buffers = [w, b], [gw, gb], [state["mw"], state["mb"]]
        with torch.no_grad():
            if written_out:  # buf = 0.9·buf + g; p = p - 0.1·buf
                for p, g, buf in zip(params, grads, buffers):
                    buf.copy_(buf * 0.9 + g)
                    p.copy_(p - 0.1 * buf)
            else:
                config = optimizer_config("sgd", {"learning_rate": 0.1, "momentum": 0.9}, [])
                torch.ops.cstorch.optimizer_update(config, params, grads, buffers, [])
        return (loss, flat * 1) if view_read_after else loss

    return step


@pytest.mark.parametrize("view_read_after", [False, True], ids=["fast pass", "general pass"])
def test_an_optimizer_writing_lists_in_place(view_read_after, monkeypatch):
    """The capture expands an op registered with ``registry.writes_lists`` into its functional
    op and the writes, on both passes; the step gives torch's numbers, as does the op run
    eagerly."""
    g = torch.Generator().manual_seed(3)
    state = {
        "w": torch.randn(3, 5, generator=g).requires_grad_(),
        "b": torch.randn(3, generator=g).requires_grad_(),
        "mw": torch.randn(3, 5, generator=g),
        "mb": torch.randn(3, generator=g),
    }
    inputs = [torch.randn(8, 5, generator=g), torch.randn(8, 3, generator=g)]
    expanded = []
    real = capture_module._expand_list_writes
    monkeypatch.setattr(
        capture_module,
        "_expand_list_writes",
        lambda graph: expanded.append(real(graph)) or expanded[-1],
    )
    want = copy.deepcopy(state)
    want_out = _optimizer_update_step(want, True, view_read_after)(*inputs)
    want_out = want_out if isinstance(want_out, tuple) else (want_out,)
    eager = copy.deepcopy(state)  # the op run eagerly (its own implementation) writes the same
    _optimizer_update_step(eager, False, view_read_after)(*inputs)
    for name, value in want.items():
        torch.testing.assert_close(eager[name], value, rtol=1e-6, atol=1e-7)
    taken = []
    real_simple = capture_module._simple_writes
    monkeypatch.setattr(
        capture_module,
        "_simple_writes",
        lambda *args: taken.append(real_simple(*args)) or taken[-1],
    )
    got, got_out = _run_captured(
        lambda s: _optimizer_update_step(s, False, view_read_after), state, inputs
    )
    assert expanded == [True]
    assert [writes is not None for writes in taken] == [not view_read_after]
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value.detach().numpy(), rtol=1e-6, atol=1e-7)
    for out, value in zip(got_out, want_out):
        np.testing.assert_allclose(out, value.detach().numpy(), rtol=1e-6, atol=1e-7)
