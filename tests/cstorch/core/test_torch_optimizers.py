"""torch's own optimizers (``torch.optim``) in a compiled step give eager torch's numbers.

Each case trains the same model with the same torch optimizer eagerly (plain torch, the
reference) and in a ``@cstorch.trace`` step, and compares losses, parameters and the
optimizer's ``state_dict`` step by step. The optimizer's state is created lazily by torch in
the first step (``cstorch.core.born_state``); checkpoints and ``load_state_dict`` must carry
it as they do for cstorch's optimizers. Also: state born in a step elsewhere (a buffer
registered in ``forward``), what a compiled step refuses (lazy modules, parameters created in
``forward``, tensors left in a list on a module, LBFGS), that a tensor kept as a module's
attribute holds each step's value, and that no tensor of a trace is ever left in
user-visible state. (Hyperparameters and optimizer edits: test_torch_hyperparameters.py.)
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import cerebras.pytorch as cstorch
from cstorch.core.compile import GradientAccumulationWarning, RecompilationWarning
from jax_backend.errors import CaptureError
from tests.lanes import marked_cases
from tests.paths import REPO

XS = [torch.randn(8, 4, generator=torch.Generator().manual_seed(i)) for i in range(6)]
YS = [torch.randn(8, 2, generator=torch.Generator().manual_seed(100 + i)) for i in range(6)]

OPTIMIZERS = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1),
    "SGD-momentum": lambda p: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, dampening=0.2, weight_decay=0.01
    ),
    "SGD-nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    "Adam": lambda p: torch.optim.Adam(p, lr=0.05),
    "Adam-amsgrad": lambda p: torch.optim.Adam(p, lr=0.05, amsgrad=True, weight_decay=0.1),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=0.05),
    "AdamW-foreach": lambda p: torch.optim.AdamW(p, lr=0.05, foreach=True),
    "Adamax": lambda p: torch.optim.Adamax(p, lr=0.05),
    "NAdam": lambda p: torch.optim.NAdam(p, lr=0.05),
    "RAdam": lambda p: torch.optim.RAdam(p, lr=0.05),
    "RMSprop": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01),
    "Adadelta": lambda p: torch.optim.Adadelta(p, lr=1.0),
    "ASGD": lambda p: torch.optim.ASGD(p, lr=0.05, t0=2),
    "Rprop": lambda p: torch.optim.Rprop(p, lr=0.01),
}
# Values are of order 1. torch's capturable path (the one a compiled step takes) computes
# bias corrections such as 1 - 0.999**step in float32 where eager torch uses Python floats:
# about 1e-6 apart after a few steps (README, differences).
TOL = dict(rtol=1e-5, atol=1e-5)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def _loss(out, y):
    return torch.nn.functional.mse_loss(out, y)


def _eager(make_optimizer, steps, model=None, optimizer=None):
    """The reference: plain eager torch. Returns (model, optimizer, losses)."""
    model = model or _model()
    optimizer = optimizer or make_optimizer(model.parameters())
    losses = []
    for x, y in zip(XS[:steps], YS[:steps]):
        optimizer.zero_grad()
        loss = _loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, optimizer, losses


def _backend(kind):
    cstorch.backend._reset_for_tests()
    if kind == "CSX":
        from cstorch.distributed import ClusterConfig

        backend = cstorch.backend("CSX", cluster_config=ClusterConfig(num_csx=1))
        cstorch.amp.enable_mixed_precision(False)  # compare the optimizer, not precision
        return backend
    return cstorch.backend("CPU")


def _compiled(make_optimizer, backend, model=None):
    model = model or _model()
    compiled = cstorch.compile(model, backend)
    optimizer = make_optimizer(model.parameters())

    @cstorch.trace
    def step(x, y):
        optimizer.zero_grad()
        loss = _loss(compiled(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return model, optimizer, step


def _assert_state_equal(actual: dict, expected: dict):
    assert actual["param_groups"] == expected["param_groups"]
    assert actual["state"].keys() == expected["state"].keys()
    for index, state in expected["state"].items():
        assert actual["state"][index].keys() == state.keys(), index
        for key, value in state.items():
            torch.testing.assert_close(
                actual["state"][index][key], value, **TOL, msg=f"state {index} {key}"
            )


def _assert_no_fakes(*values):
    leaves = torch.utils._pytree.tree_leaves(values)
    assert not [v for v in leaves if isinstance(v, FakeTensor)]


@pytest.mark.parametrize("backend_kind", ["CPU", "CSX"])
@pytest.mark.parametrize(
    "name", marked_cases(OPTIMIZERS, ids=OPTIMIZERS, slow={"Adam-amsgrad", "NAdam", "RAdam"})
)
def test_torch_optimizer_matches_eager_step_by_step(name, backend_kind):
    make = OPTIMIZERS[name]
    eager_model, eager_optimizer, eager_losses = _eager(make, 4)
    backend = _backend(backend_kind)
    model, optimizer, step = _compiled(make, backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GradientAccumulationWarning)  # zero_grad is called
        warnings.simplefilter("error", RecompilationWarning)
        losses = [float(step(x, y)) for x, y in zip(XS[:4], YS[:4])]
    torch.testing.assert_close(losses, eager_losses, **TOL)
    for (key, value), expected in zip(
        model.state_dict().items(), eager_model.state_dict().values()
    ):
        torch.testing.assert_close(value, expected, **TOL, msg=key)
    state = optimizer.state_dict()
    _assert_no_fakes(state, model.state_dict())
    _assert_state_equal(state, eager_optimizer.state_dict())
    assert len(step.programs) == 1  # the first step's program ran once and is gone


@pytest.mark.parametrize("name", ["SGD-momentum", "AdamW", "Adagrad", "RMSprop"])
@pytest.mark.slow
def test_checkpoint_and_resume_equal_eager(name, tmp_path):
    """Two compiled steps, ``cstorch.save`` of model and optimizer, a fresh backend that
    loads them and runs two more: eager torch's four steps."""
    make = OPTIMIZERS[name]
    eager_model, eager_optimizer, eager_losses = _eager(make, 4)

    model, optimizer, step = _compiled(make, _backend("CPU"))
    losses = [float(step(x, y)) for x, y in zip(XS[:2], YS[:2])]
    path = str(tmp_path / "checkpoint.mdl")
    cstorch.save({"model": model.state_dict(), "opt": optimizer.state_dict()}, path)

    model, optimizer, step = _compiled(make, _backend("CPU"))
    state = cstorch.load(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["opt"])
    losses += [float(step(x, y)) for x, y in zip(XS[2:4], YS[2:4])]

    torch.testing.assert_close(losses, eager_losses, **TOL)
    for value, expected in zip(model.state_dict().values(), eager_model.state_dict().values()):
        torch.testing.assert_close(value, expected, **TOL)
    _assert_state_equal(optimizer.state_dict(), eager_optimizer.state_dict())
    # The checkpoint loads into eager torch too (the group settings are the user's).
    plain = make(_model().parameters())
    plain.load_state_dict(cstorch.load(path)["opt"])
    assert plain.param_groups[0].get("capturable", False) is False


@pytest.mark.parametrize("name", ["Adam", "SGD-momentum"])
def test_state_dict_from_eager_torch_resumes_in_a_compiled_step(name):
    """An optimizer state_dict made by eager torch, loaded before the first compiled step:
    the compiled steps continue it as eager torch would."""
    make = OPTIMIZERS[name]
    eager_model, eager_optimizer, eager_losses = _eager(make, 4)
    half_model, half_optimizer, _ = _eager(make, 2)

    model, optimizer, step = _compiled(make, _backend("CPU"))
    model.load_state_dict(half_model.state_dict())
    optimizer.load_state_dict(half_optimizer.state_dict())
    losses = [float(step(x, y)) for x, y in zip(XS[2:4], YS[2:4])]
    torch.testing.assert_close(losses, eager_losses[2:], **TOL)
    _assert_state_equal(optimizer.state_dict(), eager_optimizer.state_dict())
    # and the loaded dict's tensors are not the optimizer's (torch would share `step`)
    given = half_optimizer.state_dict()["state"][0]
    assert all(optimizer.state[model[0].weight][k] is not v for k, v in given.items())


def test_optimizer_state_dict_between_steps_is_current():
    make = OPTIMIZERS["AdamW"]
    _, eager_optimizer, _ = _eager(make, 3)
    model, optimizer, step = _compiled(make, _backend("CPU"))
    for x, y in zip(XS[:3], YS[:3]):
        step(x, y)
        _assert_no_fakes(optimizer.state_dict())
    _assert_state_equal(optimizer.state_dict(), eager_optimizer.state_dict())


class _Counting(torch.nn.Module):
    """Registers a step counter buffer in its first forward, as some modules do."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        if not hasattr(self, "calls"):
            self.register_buffer("calls", torch.zeros(()))
        self.calls += 1
        return self.fc(x) / self.calls


@pytest.mark.parametrize("backend_kind", ["CPU", "CSX"])
def test_buffer_registered_in_forward_is_state_from_the_first_step(backend_kind):
    torch.manual_seed(0)
    eager = _Counting()
    eager_model, _, eager_losses = _eager(OPTIMIZERS["SGD"], 3, model=eager)
    torch.manual_seed(0)
    model, _, step = _compiled(OPTIMIZERS["SGD"], _backend(backend_kind), model=_Counting())
    losses = [float(step(x, y)) for x, y in zip(XS[:3], YS[:3])]
    torch.testing.assert_close(losses, eager_losses, **TOL)
    assert float(model.calls) == 3.0 == float(eager_model.calls)
    _assert_no_fakes(model.state_dict())


def test_uninitialized_lazy_module_is_refused_at_compile_with_the_fix():
    backend = _backend("CPU")
    model = torch.nn.Sequential(torch.nn.LazyLinear(2))
    with pytest.raises(ValueError, match=r"0 \(LazyLinear\).*model\(example_batch\)"):
        cstorch.compile(model, backend)


def test_lazy_module_initialized_eagerly_before_compile_matches_eager():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.LazyLinear(2))
    eager(XS[0])
    compiled_model = copy.deepcopy(eager)
    _, _, eager_losses = _eager(OPTIMIZERS["Adam"], 3, model=eager)
    _, _, step = _compiled(OPTIMIZERS["Adam"], _backend("CPU"), model=compiled_model)
    losses = [float(step(x, y)) for x, y in zip(XS[:3], YS[:3])]
    torch.testing.assert_close(losses, eager_losses, **TOL)


class _MakesAParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        if not hasattr(self, "scale"):
            self.scale = torch.nn.Parameter(torch.ones(2))  # the user's line
        return self.fc(x) * self.scale


def test_parameter_created_in_forward_is_refused_naming_the_line():
    model, optimizer, step = _compiled(OPTIMIZERS["SGD"], _backend("CPU"), model=_MakesAParameter())
    with pytest.raises(CaptureError, match=r"(?s)parameter 'scale'.*__init__.*the user's line"):
        step(XS[0], YS[0])
    assert "scale" not in model._parameters  # nothing of the trace is left behind


class _KeepsActivations(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 2)
        self.history = []

    def forward(self, x):
        out = self.fc(x)
        self.last_output = out  # a tensor of the step kept on the module
        return out


class _KeepsHistory(_KeepsActivations):
    def forward(self, x):
        out = self.fc(x)
        self.history.append(out)  # grows by one each step: no program can keep that
        return out


@pytest.mark.parametrize("backend_kind", ["CPU", "CSX"])
def test_a_tensor_kept_on_a_module_holds_each_steps_value(backend_kind):
    """As in eager torch, after each step the attribute holds that step's tensor (an output
    of the program), and the training is eager's."""
    make = OPTIMIZERS["AdamW"]
    eager = _KeepsActivations()
    optimizer = make(eager.parameters())
    model, _, step = _compiled(make, _backend(backend_kind), model=_KeepsActivations())
    for x, y in zip(XS[:3], YS[:3]):
        loss = step(x, y)
        optimizer.zero_grad()
        expected = _loss(eager(x), y)
        expected.backward()
        optimizer.step()
        torch.testing.assert_close(loss.item(), expected.item(), **TOL)
        torch.testing.assert_close(model.last_output, eager.last_output.detach(), **TOL)
    assert step.trace_count == 2  # the first step's program (AdamW's state born) and the next


def test_tensors_kept_in_a_list_on_a_module_are_refused_and_taken_out():
    model, optimizer, step = _compiled(OPTIMIZERS["AdamW"], _backend("CPU"), model=_KeepsHistory())
    with pytest.raises(CaptureError, match=r"model0\.history\[0\].*register_buffer"):
        step(XS[0], YS[0])
    assert model.history and all(h is None for h in model.history)  # taken out
    assert not hasattr(model, "last_output")
    _assert_no_fakes(optimizer.state_dict(), model.state_dict())
    assert not optimizer.state  # the failed capture's optimizer state is gone too


def test_fake_tensor_guard_checks_optimizer_state():
    """A Python value holding a traced tensor in optimizer state (not a tensor slot)."""
    backend = _backend("CPU")
    model = _model()
    compiled = cstorch.compile(model, backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        optimizer.zero_grad()
        loss = _loss(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.state[model[0].weight]["history"] = [loss]
        return loss

    with pytest.raises(CaptureError, match=r"optimizer0\.state.*'history'"):
        step(XS[0], YS[0])
    _assert_no_fakes(dict(optimizer.state))


def test_lbfgs_is_refused_with_the_reason():
    model, optimizer, step = _compiled(lambda p: torch.optim.LBFGS(p), _backend("CPU"))

    @cstorch.trace
    def lbfgs_step(x, y):
        def closure():
            optimizer.zero_grad()
            loss = _loss(model(x), y)
            loss.backward()
            return loss

        return optimizer.step(closure)

    with pytest.raises(CaptureError, match="LBFGS cannot run in a compiled step"):
        lbfgs_step(XS[0], YS[0])


class _Foreach(torch.nn.Module):
    """Multi-tensor (``torch._foreach_*``) ops on buffers, as torch's foreach optimizers use."""

    def __init__(self):
        super().__init__()
        self.register_buffer("a", torch.linspace(-1, 1, 6))
        self.register_buffer("b", torch.ones(2, 3))

    def forward(self, x):
        buffers = [self.a, self.b]
        torch._foreach_mul_(buffers, 0.5)
        torch._foreach_add_(buffers, [x.sum(), x.mean()], alpha=2.0)
        torch._foreach_maximum_(buffers, 0.1)
        torch._foreach_addcdiv_(buffers, [self.a, self.b], [self.a + 2, self.b + 2], 0.25)
        roots = torch._foreach_sqrt(buffers)
        norms = torch._foreach_norm(roots)
        return torch.stack(norms).sum() + torch._foreach_lerp(roots, buffers, 0.3)[1].sum()


def test_foreach_ops_are_decomposed_per_tensor_and_match_eager():
    eager = _Foreach()
    expected = [eager(x).item() for x in XS[:3]]
    model = _Foreach()
    compiled = cstorch.compile(model, _backend("CPU"))
    step = cstorch.trace(lambda x: compiled(x))
    torch.testing.assert_close([float(step(x)) for x in XS[:3]], expected, **TOL)
    torch.testing.assert_close(model.b, eager.b, **TOL)


@pytest.mark.slow
def test_export_needs_the_first_step_to_have_run(tmp_path):
    """The first step's program creates the optimizer state; export takes the program of
    every later step, whose state exists only once the first step ran."""
    make = OPTIMIZERS["AdamW"]
    _, _, eager_losses = _eager(make, 3)
    model, optimizer, step = _compiled(make, _backend("CPU"))
    with pytest.raises(RuntimeError, match="Run the step once, then export"):
        cstorch.export(step, (XS[0], YS[0]), str(tmp_path / "early"))
    assert not optimizer.state  # nothing of the refused export is left
    losses = [float(step(XS[0], YS[0]))]
    cstorch.export(step, (XS[1], YS[1]), str(tmp_path / "step"))
    losses += [float(step(x, y)) for x, y in zip(XS[1:3], YS[1:3])]
    torch.testing.assert_close(losses, eager_losses, **TOL)


# --------------------------------------------------------------- several devices (CSX)
def _multidevice_main():
    """Run in a subprocess with four modeled CPU devices: data parallel and weight-server
    layouts (state born in the first step reaches the devices through the host)."""
    from cstorch.distributed import ClusterConfig

    for name in ("AdamW", "SGD-momentum"):
        make = OPTIMIZERS[name]
        _, eager_optimizer, eager_losses = _eager(make, 4)
        for config in (dict(num_csx=2), dict(num_csx=2, max_wgt_servers=1)):
            cstorch.backend._reset_for_tests()
            backend = cstorch.backend("CSX", cluster_config=ClusterConfig(**config))
            cstorch.amp.enable_mixed_precision(False)
            assert backend._impl.layout is not None
            _, optimizer, step = _compiled(make, backend)
            losses = [float(step(x, y)) for x, y in zip(XS[:4], YS[:4])]
            torch.testing.assert_close(losses, eager_losses, **TOL)
            _assert_state_equal(optimizer.state_dict(), eager_optimizer.state_dict())
    print("RESULT ok")


@pytest.mark.slow
@pytest.mark.slow
def test_torch_optimizers_on_several_csx_devices_match_eager():
    import os
    import subprocess
    import sys

    path = os.pathsep.join([REPO, os.path.join(REPO, "compat"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", PYTHONPATH=path)
    out = subprocess.run(
        [sys.executable, "-m", "tests.cstorch.core.test_torch_optimizers"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert "RESULT ok" in out.stdout, out.stderr[-3000:]


if __name__ == "__main__":
    _multidevice_main()
