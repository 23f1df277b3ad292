"""Traced steps: values are not readable inside, signatures, lazy outputs, introspection."""

import warnings

import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.core.compile import FrozenValueWarning, RecompilationWarning
from jax_backend import LazyTensor


def _setup(backend_kind="CPU"):
    backend = cstorch.backend(backend_kind)
    model = torch.nn.Linear(4, 2)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    return model, compiled, optimizer


@pytest.mark.parametrize(
    "read",
    [
        lambda loss: loss.item(),
        lambda loss: print(loss),
        lambda loss: f"{loss:.3f}",
        lambda loss: float(loss),
        lambda loss: 1 if loss > 0 else 0,
    ],
)
def test_reading_a_value_inside_a_trace_points_to_step_closure(read):
    _, compiled, _ = _setup()

    @cstorch.trace
    def step(x):
        loss = compiled(x).sum()
        read(loss)
        return loss

    with pytest.raises(RuntimeError, match="step_closure") as info:
        step(torch.randn(3, 4))
    assert "test_trace.py" in str(info.value)  # names the user's line


def test_new_signature_retraces_with_a_warning_on_cpu():
    _, compiled, _ = _setup()
    runs = []

    @cstorch.trace
    def step(x):
        runs.append(1)
        return compiled(x).sum()

    step(torch.randn(3, 4))
    step(torch.randn(3, 4))
    with pytest.warns(RecompilationWarning, match="input shapes"):
        out = step(torch.randn(5, 4))
    assert out.shape == () and len(runs) == 2 and step.trace_count == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(torch.randn(5, 4))  # both signatures are cached now
        step(torch.randn(3, 4))


def test_the_recompile_warning_names_the_input_its_shapes_and_drop_last():
    _, compiled, _ = _setup()

    @cstorch.trace
    def step(features, batch, mask=None):
        return compiled(features).sum() + batch[1].sum() + mask.sum()

    step(torch.randn(3, 4), (torch.ones(2), torch.ones(3)), mask=torch.ones(3))
    with pytest.warns(RecompilationWarning) as caught:
        step(torch.randn(2, 4), (torch.ones(2), torch.ones(2)), mask=torch.ones(2))
    message = str(caught[0].message)
    assert (
        "features float32[3, 4] -> float32[2, 4], batch[1] float32[3] -> float32[2], "
        "mask float32[3] -> float32[2]"
    ) in message
    assert "drop_last=True" in message


def test_new_signature_raises_on_csx():
    _, compiled, _ = _setup("CSX")

    @cstorch.trace
    def step(x):
        return compiled(x).sum()

    step(torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="cannot recompile"):
        step(torch.randn(5, 4))


@pytest.mark.slow
def test_train_eval_mode_is_part_of_the_signature():
    torch.manual_seed(0)
    backend = cstorch.backend("CPU")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.5))
    compiled = cstorch.compile(model, backend)

    @cstorch.trace
    def forward(x):
        return compiled(x)

    x = torch.ones(8, 64)
    train_a, train_b = forward(x).materialize(), forward(x).materialize()
    zeros = (train_a == 0).float().mean().item()
    assert 0.35 < zeros < 0.65, zeros  # dropout p=0.5 is active in training mode
    assert not torch.equal(train_a, train_b)  # a fresh PRNG key every step
    compiled.eval()
    with pytest.warns(RecompilationWarning, match="train/eval mode"):
        evaluated = forward(x).materialize()
    torch.testing.assert_close(evaluated, model(x))


def test_submodule_train_and_eval_select_their_own_program():
    """``model.dropout.eval()`` on a submodule (not the compiled model) switches programs."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.5))
    compiled = cstorch.compile(model, cstorch.backend("CPU"))

    @cstorch.trace
    def forward(x):
        return compiled(x)

    x = torch.ones(8, 64)

    def zeros(out):
        return (out.materialize() == 0).float().mean().item()

    assert 0.35 < zeros(forward(x)) < 0.65  # dropout on
    model[1].eval()
    with pytest.warns(RecompilationWarning, match="train/eval mode"):
        evaluated = forward(x).materialize()
    torch.testing.assert_close(evaluated, model(x))  # dropout off: eager eval-mode output
    assert forward.trace_count == 2
    model[1].train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the first program again, not a third
        assert 0.35 < zeros(forward(x)) < 0.65
    assert forward.trace_count == 2
    model[1].eval()
    torch.testing.assert_close(forward(x).materialize(), model(x))
    assert forward.trace_count == 2 and cstorch.backend()._impl.mode == "train"


@pytest.mark.slow
def test_dropout_is_reproducible_from_torch_manual_seed():
    backend = cstorch.backend("CPU")
    model = torch.nn.Dropout(0.5)
    compiled = cstorch.compile(model, backend)

    @cstorch.trace
    def forward(x):
        return compiled(x)

    x = torch.ones(256)
    torch.manual_seed(123)
    first = [forward(x).materialize() for _ in range(2)]
    torch.manual_seed(123)
    second = [forward(x).materialize() for _ in range(2)]
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    assert set(first[0].unique().tolist()) <= {0.0, 2.0}


def test_outputs_are_lazy_tensors_that_behave_like_tensors():
    _, compiled, _ = _setup()

    @cstorch.trace
    def step(x):
        out = compiled(x)
        return {"sum": out.sum(), "out": out, "label": "constant"}

    x = torch.randn(3, 4)
    result = step(x)
    assert result["label"] == "constant"
    assert isinstance(result["sum"], LazyTensor)
    expected = compiled(x)
    torch.testing.assert_close(result["out"] + 1, expected + 1)
    assert result["sum"].item() == pytest.approx(expected.sum().item(), rel=1e-6)
    assert f"{result['sum']:.2f}" == f"{expected.sum().item():.2f}"
    assert result["out"].numpy().shape == (3, 2)
    assert "tensor(" in repr(result["sum"])


@pytest.mark.slow
def test_lazy_outputs_feed_the_next_step_without_a_host_copy():
    _, compiled, _ = _setup()

    @cstorch.trace
    def step(x):
        return compiled(x) @ torch.ones(2, 4)

    x = torch.randn(3, 4)
    y = step(step(x))
    assert y.shape == (3, 4)


def test_frozen_python_arguments_warn_when_they_change():
    _, compiled, _ = _setup()

    @cstorch.trace
    def step(x, scale):
        return compiled(x).sum() * scale

    x = torch.randn(3, 4)
    first = step(x, 2.0).item()
    with pytest.warns(FrozenValueWarning, match="changed from 2.0 to 3.0"):
        second = step(x, 3.0).item()
    assert second == pytest.approx(first)  # the graph keeps the traced value


def test_two_compiled_models_in_one_step_raise():
    backend = cstorch.backend("CPU")
    a = cstorch.compile(torch.nn.Linear(2, 2), backend)
    b = cstorch.compile(torch.nn.Linear(2, 2), backend)

    @cstorch.trace
    def step(x):
        return b(a(x)).sum()

    with pytest.raises(RuntimeError, match="more than one compiled model"):
        step(torch.randn(1, 2))


def test_parameters_of_uncompiled_modules_are_rejected():
    backend = cstorch.backend("CPU")
    compiled = cstorch.compile(torch.nn.Linear(2, 2), backend)
    stray = torch.nn.Linear(2, 2)

    @cstorch.trace
    def step(x):
        loss = stray(compiled(x)).sum()
        loss.backward()
        return loss

    with pytest.raises(RuntimeError, match="not part of any compiled model"):
        step(torch.randn(1, 2))


def test_unsupported_op_names_the_op_and_the_line(monkeypatch):
    from jax_backend import registry

    monkeypatch.delitem(registry._LOWERINGS, torch.ops.aten.sin.default)
    backend = cstorch.backend("CPU")
    compiled = cstorch.compile(torch.nn.Linear(2, 2), backend)

    @cstorch.trace
    def step(x):
        return torch.sin(compiled(x)).sum()  # the unsupported line

    with pytest.raises(NotImplementedError, match="aten.sin.default") as info:
        step(torch.randn(1, 2))
    assert "the unsupported line" in str(info.value)


def test_introspection_of_the_compiled_program():
    _, compiled, optimizer = _setup()

    @cstorch.trace
    def step(x):
        loss = compiled(x).sum()
        loss.backward()
        optimizer.step()
        return loss

    step(torch.randn(3, 4))
    assert "dot_general" in str(step.jaxpr())
    assert "stablehlo" in step.stablehlo()
    assert callable(step.pure_function())
    cost = step.cost_analysis()
    assert cost is not None


def _train_step(compiled, optimizer):
    @cstorch.trace
    def train_step(x):
        loss = compiled(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return train_step


@pytest.mark.parametrize("kind", ["CPU", "CSX"])
def test_new_stateful_objects_do_not_recompile_existing_steps(kind):
    model, compiled, optimizer = _setup(kind)
    cstorch.amp.enable_mixed_precision(False)
    train_step = _train_step(compiled, optimizer)
    x = torch.randn(3, 4)
    first = train_step(x).item()
    # An eval metric and a second optimizer appear after the step compiled.
    cstorch.metrics.AccuracyMetric("accuracy")
    cstorch.optim.SGD(model.parameters(), lr=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecompilationWarning)
        second = train_step(x).item()
    assert train_step.trace_count == 1
    assert second < first  # the step still updates the same parameters


@pytest.mark.slow
def test_changing_a_python_number_hyperparameter_recompiles():
    model, compiled, optimizer = _setup("CPU")
    train_step = _train_step(compiled, optimizer)
    x = torch.randn(3, 4)
    train_step(x)
    before = model.state_dict()["weight"].clone()
    optimizer.param_groups[0]["lr"] = 0.0  # a Python number is a graph constant
    with pytest.warns(RecompilationWarning, match="hyperparameter"):
        train_step(x)
    assert torch.equal(model.state_dict()["weight"], before)  # lr 0 was used
    # A scheduler makes lr a tensor: one more compile, after which lr changes are free.
    cstorch.optim.lr_scheduler.LinearLR(
        optimizer, initial_learning_rate=0.1, end_learning_rate=0.0, total_iters=2
    )
    with pytest.warns(RecompilationWarning):
        train_step(x)
    assert train_step.trace_count == 3


def test_changing_a_python_number_hyperparameter_raises_on_csx():
    _, compiled, optimizer = _setup("CSX")
    train_step = _train_step(compiled, optimizer)
    train_step(torch.randn(3, 4))
    optimizer.param_groups[0]["lr"] = 0.05
    with pytest.raises(RuntimeError, match="hyperparameter"):
        train_step(torch.randn(3, 4))
