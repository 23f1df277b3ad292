"""Tensors that share memory with state read the newest value between steps, and edits made
through them reach the next step, exactly as in eager torch.

Every case runs twice from the same initial values and data: once compiled, once in plain
eager torch (``torch.optim`` SGD with momentum, or Adam with ``eps=0``, whose update is then
the same arithmetic as cstorch's). The alias is taken in both runs the same way (before the
first step, or after the first), read after every step and edited once between steps, and
the readings, losses and final weights must agree.

The model has a weight of 128 KiB (its torch copy is released between steps unless something
shares it), small parameters, BatchNorm buffers and, for ``tied``, one weight used by two
layers. ``release_all`` runs the same cases with every state tensor released.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from jax_backend import DeviceState
from tests.training import compiled_sgd_step, squared_error_step

# Every case here holds an alias, so the engine warns (SharedStateWarning) in each; the warning
# itself is asserted by test_the_shared_state_warning_names_the_tensor_once.
pytestmark = [
    pytest.mark.core,
    pytest.mark.filterwarnings("ignore::jax_backend.state.SharedStateWarning"),
]

STEPS = 5
EDIT_AFTER = 2  # the edit lands between steps EDIT_AFTER and EDIT_AFTER + 1
XS = [torch.randn(8, 128, generator=torch.Generator().manual_seed(i)) for i in range(STEPS)]
YS = [torch.randn(8, 4, generator=torch.Generator().manual_seed(100 + i)) for i in range(STEPS)]


class Tied(torch.nn.Module):
    """One square weight used twice (the same Parameter object in two modules), or, untied,
    two weights of the same shape."""

    def __init__(self, tie=True):
        super().__init__()
        self.inp = torch.nn.Linear(128, 32)
        self.mid = torch.nn.Linear(32, 32)
        self.again = torch.nn.Linear(32, 32)
        if tie:
            self.again.weight = self.mid.weight
        self.out = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.out(torch.tanh(self.again(torch.tanh(self.mid(torch.tanh(self.inp(x)))))))


def _model(kind):
    torch.manual_seed(0)
    if kind in ("tied", "untied"):
        return Tied(tie=kind == "tied")
    if kind == "plain":  # no BatchNorm: it cancels the first bias's gradient (0/0 in Adam)
        return torch.nn.Sequential(
            torch.nn.Linear(128, 256), torch.nn.Tanh(), torch.nn.Identity(), torch.nn.Linear(256, 4)
        )
    return torch.nn.Sequential(
        torch.nn.Linear(128, 256),
        torch.nn.BatchNorm1d(256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 4),
    )


def _optimizer(engine, name, params):
    params = list(params)
    if engine == "cstorch":
        if name == "sgd":
            return cstorch.optim.SGD(params, lr=0.1, momentum=0.9)
        return cstorch.optim.Adam(params, lr=0.01, eps=0.0)
    if name == "sgd":
        optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        for p in params:  # cstorch creates state up front; so does this reference
            optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p)
        return optimizer
    optimizer = torch.optim.Adam(params, lr=0.01, eps=0.0)
    for p in params:
        optimizer.state[p].update(
            step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p)
        )
    return optimizer


def build(engine, model_kind="mlp", optimizer="sgd", model=None):
    """(model, optimizer, step): the same training step compiled or eager."""
    model = model if model is not None else _model(model_kind)
    if engine == "cstorch":
        backend = cstorch.backend("CPU")
        compiled = cstorch.compile(model, backend)
    else:
        compiled = model
    opt = _optimizer(engine, optimizer, model.parameters())

    body = squared_error_step(compiled, opt)
    step = cstorch.trace(body) if engine == "cstorch" else body
    return model, opt, step


def _read(alias) -> np.ndarray:
    """A copy of what the alias shows, read without passing through the state tensor."""
    if isinstance(alias, np.ndarray):
        return np.array(alias, copy=True)
    with torch.no_grad():
        return alias.detach().clone().numpy()


def _train(engine, take, edit=None, when="before", model_kind="mlp", optimizer="sgd", prepare=None):
    """Trains STEPS steps; the alias is taken ``when`` ("before" the first step or
    "between" the first two), read after each step, edited after step EDIT_AFTER."""
    model = _model(model_kind)
    keep = prepare(model) if prepare is not None else None
    model, opt, step = build(engine, model_kind, optimizer, model=model)
    alias = take(model, opt, keep) if when == "before" else None
    losses, seen = [], []
    for i in range(STEPS):
        losses.append(step(XS[i], YS[i]).item())
        if alias is None:
            alias = take(model, opt, keep)
        seen.append(_read(alias))
        if edit is not None and i + 1 == EDIT_AFTER:
            with torch.no_grad():
                edit(alias)
            seen.append(_read(alias))
    final = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return losses, seen, final


def _close(a, b, what, atol=1e-6):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=atol, err_msg=what)


def assert_like_eager(take, edit=None, when="before", **options):
    ours = _train("cstorch", take, edit, when, **options)
    cstorch.backend._reset_for_tests()
    eager = _train("eager", take, edit, when, **options)
    # Adam without eps divides by sqrt(v) as it is: where v is tiny, rounding differences
    # of 1e-7 in the gradient move a weight by up to ~1e-5 (a step is lr = 1e-2; an edit or
    # a stale value moves it by ~1e-3).
    atol = 2e-5 if options.get("optimizer") == "adam" else 1e-6
    for i, (a, b) in enumerate(zip(ours[1], eager[1])):
        _close(a, b, f"alias reading {i}", atol)
    _close(np.array(ours[0]), np.array(eager[0]), "losses", atol)
    for key in eager[2]:
        _close(ours[2][key].numpy(), eager[2][key].numpy(), key, atol)
    return ours


# ------------------------------------------------------------------ aliases of one weight
def _big(model):
    return model[0].weight  # 128 KiB: released between steps when nothing shares it


def _small(model):
    return model[3].weight  # 4 KiB


TAKES = {
    "data": lambda m, o, k: _big(m).data,
    "detach": lambda m, o, k: _big(m).detach(),
    "row_view": lambda m, o, k: _big(m)[0],
    "flat_view": lambda m, o, k: _big(m).view(-1),
    "transpose": lambda m, o, k: _big(m).t(),
    "small_data": lambda m, o, k: _small(m).data,
    "small_view": lambda m, o, k: _small(m)[1:3],
    "state_dict": lambda m, o, k: m.state_dict()["0.weight"],
    "state_dict_bias": lambda m, o, k: m.state_dict()["0.bias"],
    "numpy": lambda m, o, k: _big(m).detach().numpy(),
    "small_numpy": lambda m, o, k: _small(m).detach().numpy(),
    "buffer_numpy": lambda m, o, k: m[1].running_mean.numpy(),
    "buffer_state_dict": lambda m, o, k: m.state_dict()["1.running_var"],
    "momentum_view": lambda m, o, k: o.state_dict()["state"][0]["momentum_buffer"].view(-1),
}

EDITS = {
    "mul": lambda alias: alias.mul_(0.5),
    "zero": lambda alias: alias.zero_(),
    "numpy_mul": lambda alias: np.multiply(alias, 0.5, out=alias),
    "numpy_fill": lambda alias: alias.__setitem__(Ellipsis, 0.25),
}


def _edit_for(kind):
    return "numpy_mul" if "numpy" in kind else "mul"


@pytest.mark.parametrize("when", ["before", "between"])
@pytest.mark.parametrize("kind", sorted(TAKES))
def test_alias_reads_newest_value_and_its_edit_reaches_the_next_step(kind, when):
    assert_like_eager(TAKES[kind], EDITS[_edit_for(kind)], when)


@pytest.mark.parametrize("kind", ["data", "row_view", "numpy", "state_dict", "momentum_view"])
def test_alias_with_every_state_tensor_released(kind, monkeypatch):
    monkeypatch.setattr(DeviceState, "release_min_bytes", 0)
    edit = "numpy_fill" if "numpy" in kind else "zero"
    assert_like_eager(TAKES[kind], EDITS[edit], "before")
    cstorch.backend._reset_for_tests()
    assert_like_eager(TAKES[kind], EDITS[edit], "between")


def test_alias_read_without_any_edit():
    assert_like_eager(TAKES["detach"])


def _edit_between(edit, steps=STEPS, **options):
    """``edit(model, optimizer, kept)`` after EDIT_AFTER steps, in both runs; ``kept`` is
    what ``take`` returned before the first step (or None). Compares losses and weights."""
    take = options.pop("take", lambda m, o: None)
    results = []
    for engine in ("cstorch", "eager"):
        cstorch.backend._reset_for_tests()
        model, opt, step = build(engine, **options)
        kept = take(model, opt)
        losses = []
        for i in range(steps):
            losses.append(step(XS[i], YS[i]).item())
            if i + 1 == EDIT_AFTER:
                with torch.no_grad():
                    edit(model, opt, kept)
                kept = None  # dropped: nothing holds the alias any more
        results.append((losses, {k: v.detach().clone() for k, v in model.state_dict().items()}))
    (ours, ours_state), (eager, eager_state) = results
    _close(np.array(ours), np.array(eager), "losses")
    for key in eager_state:
        _close(ours_state[key].numpy(), eager_state[key].numpy(), key)


def test_data_alias_taken_before_training_edited_then_dropped():
    # `.data` has a version counter of its own: the edit bumps nothing the weight has.
    _edit_between(lambda m, o, data: data.mul_(0.5), take=lambda m, o: _big(m).data)


def test_numpy_alias_taken_before_training_edited_then_dropped():
    _edit_between(
        lambda m, o, array: np.multiply(array, 0.5, out=array),
        take=lambda m, o: _small(m).detach().numpy(),
    )


@pytest.mark.parametrize("how", ["numpy", "asarray", "data", "storage"])
def test_alias_made_edited_and_dropped_between_steps(how):
    def edit(model, optimizer, kept):
        weight = _big(model)
        if how == "numpy":
            array = weight.detach().numpy()
            array[:10] = 0.5
        elif how == "asarray":
            np.asarray(weight.detach())[3] *= -1
        elif how == "data":
            weight.data[5:7].fill_(0.125)
        else:
            storage = weight.untyped_storage()
            torch.tensor([], dtype=torch.float32).set_(storage).zero_()

    _edit_between(edit)


# ------------------------------------------------------------------ optimizer state
@pytest.mark.parametrize("when", ["before", "between"])
def test_adam_moment_view_from_optimizer_state_dict(when):
    take = lambda m, o, k: o.state_dict()["state"][0]["exp_avg"].view(-1)  # noqa: E731
    assert_like_eager(take, EDITS["mul"], when, model_kind="plain", optimizer="adam")


def test_adam_second_moment_numpy_view():
    take = lambda m, o, k: o.state_dict()["state"][2]["exp_avg_sq"].numpy()  # noqa: E731
    assert_like_eager(take, EDITS["numpy_mul"], "between", model_kind="plain", optimizer="adam")


# ------------------------------------------------------------------ tied weights
@pytest.mark.parametrize("when", ["before", "between"])
def test_tied_weight_alias(when):
    take = lambda m, o, k: m.again.weight.detach()  # noqa: E731
    assert_like_eager(take, EDITS["mul"], when, model_kind="tied")


def test_tied_weight_numpy_alias_released(monkeypatch):
    monkeypatch.setattr(DeviceState, "release_min_bytes", 0)
    take = lambda m, o, k: m.mid.weight.detach().numpy()  # noqa: E731
    assert_like_eager(take, EDITS["numpy_mul"], "before", model_kind="tied", optimizer="adam")


# ------------------------------------------------------------------ memory from numpy
def _from_numpy_weight(model):
    """The big weight's memory becomes a numpy array that the user keeps."""
    array = model[0].weight.detach().numpy().copy()
    model[0].weight = torch.nn.Parameter(torch.from_numpy(array))
    return array


@pytest.mark.parametrize("edit", [None, "numpy_mul"])
def test_parameter_made_with_from_numpy_whose_array_is_kept(edit):
    assert_like_eager(
        lambda m, o, array: array, edit and EDITS[edit], "before", prepare=_from_numpy_weight
    )


def test_parameter_data_replaced_by_a_numpy_array_between_steps():
    def take(model, optimizer, keep):
        array = np.full((256, 128), 0.01, dtype=np.float32)
        model[0].weight.data = torch.from_numpy(array)
        return array

    assert_like_eager(take, EDITS["numpy_mul"], "between")


# ------------------------------------------------------------------ cost and warning
def test_a_loop_without_aliases_writes_nothing_through_and_warns_nothing():
    import warnings

    model, opt, step = build("cstorch")
    state = cstorch.backend()._impl.device_state
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a SharedStateWarning would fail here
        for i in range(3):
            step(XS[i], YS[i])
            with torch.no_grad():
                _big(model).detach().clone()  # a transient alias: re-uploaded, not shared
        step(XS[3], YS[3])
    assert state.is_released(_big(model))  # large state keeps being released


@pytest.mark.parametrize("fmt", ["h5", "safetensors"])
def test_a_checkpoint_saved_before_compiling_leaves_no_alias(tmp_path, fmt):
    # The 1.x runners save the initial state before the first step. Saving reads each tensor
    # through numpy; ``Tensor.numpy()`` would mark its storage as numpy's for good, and every
    # later step would then write its state through to torch (and warn).
    import warnings

    model = _model("mlp")
    if fmt == "h5":
        cstorch.save({"model": model.state_dict()}, tmp_path / "initial.mdl")
    else:
        from cstorch.storage import safetensors_format

        safetensors_format.write(tmp_path / "initial.safetensors", model.state_dict())
    assert _big(model).untyped_storage().resizable()
    model, opt, step = build("cstorch", model=model)
    state = cstorch.backend()._impl.device_state
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a SharedStateWarning would fail here
        losses = [step(XS[i], YS[i]).item() for i in range(3)]
    assert state.is_released(_big(model))
    eager_model, _, eager_step = build("eager")
    assert losses == pytest.approx([eager_step(XS[i], YS[i]).item() for i in range(3)], rel=1e-5)


def test_torch_optimizer_state_resumed_from_cstorch_load_is_no_alias(tmp_path):
    # torch's Optimizer.load_state_dict keeps the loaded tensors themselves; cstorch.load's
    # are deferred (read on use), which the state guard cannot watch. A torch optimizer in a
    # compiled step loads copies (see the README); this checks that a mid-run resume so
    # leaves no alias and continues as eager torch does. (The 1.x ``cbtorch.optimizer`` path,
    # which kept the deferred tensors, is tests/compat/test_lazy_api_1x.py.)
    import warnings

    eager, eager_opt, eager_step = build("eager")
    for i in range(2):
        eager_step(XS[i], YS[i])
    cstorch.save(
        {"model": eager.state_dict(), "optimizer": eager_opt.state_dict()}, tmp_path / "c.mdl"
    )
    resumed = _model("mlp")
    compiled = cstorch.compile(resumed, cstorch.backend("CPU"))
    resumed_opt = _optimizer("eager", "sgd", resumed.parameters())  # torch SGD, state made
    resumed_step = cstorch.trace(squared_error_step(compiled, resumed_opt))
    resumed_step(XS[0], YS[0])  # a running job loads a checkpoint
    state = cstorch.load(tmp_path / "c.mdl")
    resumed.load_state_dict(state["model"])
    resumed_opt.load_state_dict(state["optimizer"])
    del state
    device_state = cstorch.backend()._impl.device_state
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a SharedStateWarning would fail here
        losses = [resumed_step(XS[i], YS[i]).item() for i in range(2, STEPS)]
    assert device_state.is_released(_big(resumed))
    assert losses == pytest.approx(
        [eager_step(XS[i], YS[i]).item() for i in range(2, STEPS)], rel=1e-5
    )


def test_the_shared_state_warning_names_the_tensor_once():
    import warnings

    from jax_backend.state import SharedStateWarning

    model, opt, step = build("cstorch")
    alias = _big(model).view(-1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            step(XS[i], YS[i])
    shared = [w for w in caught if issubclass(w.category, SharedStateWarning)]
    assert len(shared) == 1
    assert "0.weight" in str(shared[0].message) and ".clone()" in str(shared[0].message)
    assert not cstorch.backend()._impl.device_state.is_released(_big(model))
    del alias
    step(XS[3], YS[3])
    assert cstorch.backend()._impl.device_state.is_released(_big(model))


def test_a_kept_numpy_array_never_sees_freed_memory(monkeypatch):
    """Every state tensor released where safe: one a numpy array shares keeps its memory."""
    monkeypatch.setattr(DeviceState, "release_min_bytes", 0)
    model, opt, step = build("cstorch")
    arrays = [p.detach().numpy() for p in model.parameters()]
    state = cstorch.backend()._impl.device_state
    for i in range(3):
        step(XS[i], YS[i])
    for p, array in zip(model.parameters(), arrays):
        assert not state.is_released(p)
        np.testing.assert_array_equal(array, np.array(state.array_of(p)))


def _csx_run(through_alias):
    from cstorch.distributed import ClusterConfig

    cstorch.backend._reset_for_tests()
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(num_csx=1))
    model = _model("mlp")
    optimizer, step = compiled_sgd_step(model, backend)

    alias = _big(model).detach() if through_alias else None
    state = backend._impl.device_state
    for i in range(3):
        step(XS[i], YS[i])
        if alias is not None:
            np.testing.assert_array_equal(alias.numpy(), np.array(state.array_of(_big(model))))
    with torch.no_grad():
        (alias if through_alias else _big(model)).mul_(0.5)
    losses = [step(XS[i], YS[i]).item() for i in range(3, 5)]
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def test_alias_on_the_csx_mesh_reads_each_steps_value_and_its_edit_counts():
    """Mixed precision on the modelled wafer: compared with the same edit made on the
    parameter itself (a path with no alias), bit for bit."""
    ours, reference = _csx_run(True), _csx_run(False)
    assert ours[0] == reference[0]
    for key in reference[1]:
        assert torch.equal(ours[1][key], reference[1][key]), key


def test_engine_made_tensors_are_plain_and_uploads_leave_storage_resizable():
    import jax.numpy as jnp
    import ml_dtypes

    from jax_backend import dtypes, shared_memory

    for dtype in (jnp.float32, jnp.bfloat16):
        zeros = dtypes.initial_tensor(jnp.zeros((4, 3), dtype))
        ones = dtypes.array_to_tensor(jnp.ones((4, 3), dtype))
        for tensor in (zeros, ones):
            assert not tensor._is_view() and not shared_memory.shared_elsewhere(tensor)
            assert not shared_memory.may_be_foreign(tensor)  # non-resizable, but ours
        assert zeros.dtype == ones.dtype == dtypes.to_torch_dtype(dtype)
        assert float(ones.float().sum()) == 12
    user = torch.from_numpy(np.ones(3, np.float32))
    assert shared_memory.may_be_foreign(user)
    for tensor in (
        torch.randn(5, 4),
        torch.randn(4, 5).t(),
        torch.randn(3).to(torch.bfloat16),
        torch.randn(3, dtype=torch.complex64).conj(),
        torch.tensor(True),
    ):
        host = dtypes.state_to_host(tensor)
        assert tensor.untyped_storage().resizable()  # not exported to numpy
        expected = tensor.resolve_conj()
        if tensor.dtype == torch.bfloat16:
            assert host.dtype == ml_dtypes.bfloat16
            expected, host = expected.view(torch.int16), host.view(np.int16)
        np.testing.assert_array_equal(host, expected.numpy())
