"""``cstorch.optim.from_optax``: optax transformations inside a traced step.

Where the maths is the same, a from_optax optimizer must follow the built-in cstorch optimizer
step for step: optax.adamw vs cstorch AdamW (eps so small that its placement, before or after
the bias correction, cannot matter) and optax.sgd vs cstorch SGD with momentum.
"""

import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F

import cerebras.pytorch as cstorch

STEPS = 8


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def _batches():
    g = torch.Generator().manual_seed(2)
    return [
        (torch.randn(10, 6, generator=g), torch.randint(0, 3, (10,), generator=g))
        for _ in range(STEPS)
    ]


def _train(make_optimizer, engine="jax"):
    cstorch.backend._reset_for_tests()
    backend = cstorch.backend("CPU", engine=engine)
    model = _model()
    compiled = cstorch.compile(model, backend)
    optimizer = make_optimizer(model.parameters())
    losses = []

    @cstorch.step_closure
    def record(loss):
        losses.append(loss.item())

    @cstorch.trace
    def training_step(inputs, targets):
        loss = F.cross_entropy(compiled(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record(loss)

    batches = _batches()
    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: batches), num_steps=STEPS
    )
    for inputs, targets in executor:
        training_step(inputs, targets)
    return losses, [p.detach().clone() for p in model.parameters()], optimizer


PAIRS = {
    "adamw": (
        lambda ps: cstorch.optim.from_optax(
            optax.adamw(1e-2, b1=0.9, b2=0.99, eps=1e-12, weight_decay=0.05), ps
        ),
        lambda ps: cstorch.optim.AdamW(
            ps, lr=1e-2, betas=(0.9, 0.99), eps=1e-12, weight_decay=0.05
        ),
    ),
    "sgd_momentum": (
        lambda ps: cstorch.optim.from_optax(optax.sgd(0.1, momentum=0.9), ps),
        lambda ps: cstorch.optim.SGD(ps, lr=0.1, momentum=0.9),
    ),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
@pytest.mark.slow
def test_from_optax_matches_builtin_trajectory(name):
    make_optax, make_builtin = PAIRS[name]
    expected_losses, expected_params, _ = _train(make_builtin)
    losses, params, optimizer = _train(make_optax)
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-6)
    for p, q in zip(params, expected_params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_from_optax_on_the_eager_engine_matches_the_compiled_step():
    make = PAIRS["adamw"][0]
    compiled_losses, compiled_params, _ = _train(make)
    eager_losses, eager_params, _ = _train(make, engine="eager")
    np.testing.assert_allclose(eager_losses, compiled_losses, rtol=1e-6)
    for p, q in zip(eager_params, compiled_params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)


def test_optax_state_is_per_parameter_and_round_trips_state_dict():
    _, _, optimizer = _train(PAIRS["adamw"][0])
    params = list(optimizer.param_groups[0]["params"])
    first = optimizer.state[params[0]]
    assert first["optax[0].count"].dtype == torch.int32 and int(first["optax[0].count"]) == STEPS
    for p in params:
        assert optimizer.state[p]["optax[0].mu"].shape == p.shape
        assert optimizer.state[p]["optax[0].nu"].shape == p.shape
    saved = optimizer.state_dict()
    fresh = cstorch.optim.from_optax(optax.adamw(1e-2, eps=1e-12, weight_decay=0.05), params)
    fresh.load_state_dict(saved)
    assert fresh.state[params[0]]["optax[0].count"].dtype == torch.int32
    torch.testing.assert_close(
        fresh.state[params[1]]["optax[0].nu"], optimizer.state[params[1]]["optax[0].nu"]
    )


def test_from_optax_rejects_bad_arguments():
    cstorch.backend("CPU")
    model = _model()
    with pytest.raises(TypeError, match="GradientTransformation"):
        cstorch.optim.from_optax(torch.optim.SGD, model.parameters())
    with pytest.raises(TypeError, match="param groups do not apply"):
        cstorch.optim.from_optax(optax.sgd(0.1), [{"params": list(model.parameters())}])


@pytest.mark.slow
def test_builtin_optimizer_and_schedule_used_from_jax_directly():
    """The README's recipe: jax_backend's AdamW with a cstorch cosine schedule through
    optax.inject_hyperparams, on a JAX model, follows cstorch AdamW + CosineDecayLR."""
    import jax
    import jax.numpy as jnp

    from jax_backend import optimizers, schedules

    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(16, 5, generator=g), torch.randn(16, 2, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2)
    start = [p.detach().clone().numpy() for p in model.parameters()]  # numpy() marks memory

    backend = cstorch.backend("CPU")
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    scheduler = cstorch.optim.lr_scheduler.CosineDecayLR(
        optimizer, initial_learning_rate=0.05, end_learning_rate=0.005, total_iters=6
    )
    losses = []

    @cstorch.step_closure
    def record(loss):
        losses.append(loss.item())

    @cstorch.trace
    def training_step(inputs, targets):
        loss = F.mse_loss(compiled(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        record(loss)

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: [(x, y)] * STEPS), num_steps=STEPS
    )
    for inputs, targets in executor:
        training_step(inputs, targets)

    tx = optax.inject_hyperparams(optimizers.adamw)(
        learning_rate=schedules.cosine_decay(initial=0.05, end=0.005, total_iters=6),
        weight_decay=0.01,
    )
    params = [jnp.asarray(p) for p in start]
    state = tx.init(params)

    def loss_fn(params):
        w, b = params
        return jnp.mean((jnp.asarray(x.numpy()) @ w.T + b - jnp.asarray(y.numpy())) ** 2)

    jax_losses = []
    for _ in range(STEPS):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        jax_losses.append(float(loss))
    np.testing.assert_allclose(jax_losses, losses, rtol=1e-5)
    for p, q in zip(params, model.parameters()):
        np.testing.assert_allclose(np.asarray(p), q.detach().numpy(), rtol=1e-5, atol=1e-6)
