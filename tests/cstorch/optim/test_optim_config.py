"""The cstorch 1.x configuration helpers of ``cstorch.optim``."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

import cstorch
from cstorch.optim import (
    configure_lr_scheduler,
    configure_optimizer,
    configure_optimizer_params,
    configure_scheduler,
    configure_scheduler_params,
    lr_scheduler as L,
    weight_decay_scheduler as WD,
)


def _params():
    return [torch.nn.Parameter(torch.zeros(2, 2))]


def _sgd(**kwargs):
    return cstorch.optim.SGD(_params(), lr=0.1, **kwargs)


def _series(optimizer, scheduler, steps, group=0):
    values = []
    for _ in range(steps):
        values.append(scheduler.get_last_lr()[group].item())
        optimizer.step()
        scheduler.step()
    return values


# ------------------------------------------------------------------ optimizers
def test_configure_optimizer_by_name(cpu_backend):
    optimizer = configure_optimizer(
        "AdamW", _params(), learning_rate=0.01, weight_decay=0.1, betas=(0.8, 0.9)
    )
    assert type(optimizer) is cstorch.optim.AdamW
    group = optimizer.param_groups[0]
    assert group["lr"] == 0.01 and group["weight_decay"] == 0.1 and group["betas"] == (0.8, 0.9)
    assert type(configure_optimizer("sgd", _params(), learning_rate="0.5")) is cstorch.optim.SGD
    assert configure_optimizer("sgd", _params(), learning_rate="0.5").param_groups[0]["lr"] == 0.5


def test_learning_rate_defaults(cpu_backend):
    assert configure_optimizer("adam", _params()).param_groups[0]["lr"] == 1e-3
    # lr is required: a dummy 0.1 (a scheduler is expected to set it)
    assert configure_optimizer("SGD", _params()).param_groups[0]["lr"] == 0.1
    # a schedule config as learning_rate leaves lr to its default
    optimizer = configure_optimizer("Lion", _params(), learning_rate={"scheduler": "constant"})
    assert optimizer.param_groups[0]["lr"] == 1e-4


def test_configure_optimizer_params_does_not_mutate(cpu_backend):
    kwargs = {"learning_rate": 0.2, "momentum": 0.9, "unused": 1}
    cls, cls_kwargs = configure_optimizer_params("SGD", kwargs)
    assert cls is cstorch.optim.SGD and cls_kwargs == {"lr": 0.2, "momentum": 0.9}
    assert kwargs == {"learning_rate": 0.2, "momentum": 0.9, "unused": 1}


def test_unknown_optimizer(cpu_backend):
    with pytest.raises(ValueError, match=r"Expected one of \[.*'adafactor'.*'sgd'.*Got: 'adamz'"):
        configure_optimizer("adamz", _params())


@pytest.mark.parametrize(
    "name,kwargs,expected,old",
    [
        ("SGD", {"weight_decay_rate": 0.1}, "weight_decay", "weight_decay_rate"),
        ("Adam", {"beta1": 0.9, "beta2": 0.99}, "betas", "beta1"),
        ("Lamb", {"beta2": 0.99}, "betas", "beta2"),
        ("Adam", {"eps1": 1e-8}, "eps", "eps1"),
        ("Rprop", {"eta1": 0.5, "eta2": 1.2}, "etas", "eta1"),
        ("Rprop", {"step_size_min": 1e-6}, "step_sizes", "step_size_min"),
    ],
)
def test_deprecated_optimizer_parameters(name, kwargs, expected, old, cpu_backend):
    with pytest.raises(ValueError, match=f"expected: {expected}, actual: {old}"):
        configure_optimizer(name, _params(), **kwargs)


def test_unused_parameters_are_only_logged(cpu_backend, caplog):
    with caplog.at_level(logging.WARNING):
        optimizer = configure_optimizer("SGD", _params(), learning_rate=0.1, foo=1, bar=2)
    assert type(optimizer) is cstorch.optim.SGD
    assert "2 unexpected and unused parameters: ['bar', 'foo']" in caplog.text
    assert "SGD(params, lr=0.1" in caplog.text


def test_construction_type_errors_become_runtime_errors(cpu_backend):
    with pytest.raises(RuntimeError, match="Failed to configure SGD optimizer"):
        configure_optimizer("SGD", _params(), momentum="fast")


def test_user_optimizers_are_found(cpu_backend):
    class MyOpt(cstorch.optim.Optimizer):
        def __init__(self, params, lr=0.3, gain=1.0):
            super().__init__(params, dict(lr=lr, gain=gain))

        def preinitialize(self):
            pass

        def step(self, closure=None):
            pass

    optimizer = configure_optimizer("myopt", _params(), gain=2.0)
    assert type(optimizer) is MyOpt and optimizer.param_groups[0]["gain"] == 2.0
    assert optimizer.param_groups[0]["lr"] == 0.3


# ------------------------------------------------------------------ learning-rate configs
def test_falsy_and_constant_learning_rates(cpu_backend):
    optimizer = _sgd()
    assert configure_lr_scheduler(optimizer, None) is None
    assert configure_lr_scheduler(optimizer, 0.0) is None
    constant = configure_lr_scheduler(optimizer, 0.25)
    assert type(constant) is L.ConstantLR and constant.learning_rate == 0.25
    assert type(configure_lr_scheduler(optimizer, "0.5")) is L.ConstantLR
    assert optimizer.param_groups[0]["lr"].item() == 0.5
    with pytest.raises(ValueError, match="Unsupported LR scheduler type"):
        configure_lr_scheduler(optimizer, object())


@pytest.mark.parametrize("name", ["linear", "LinearLR", "LINEAR", "linearlr"])
def test_single_scheduler_names(name, cpu_backend):
    scheduler = configure_lr_scheduler(
        _sgd(),
        {
            "scheduler": name,
            "initial_learning_rate": 1.0,
            "end_learning_rate": 0.0,
            "total_iters": 4,
        },
    )
    assert type(scheduler) is L.LinearLR


def test_list_becomes_sequential_with_cumulative_milestones(cpu_backend):
    optimizer = _sgd()
    config = [
        {
            "scheduler": "Linear",
            "initial_learning_rate": 0.0,
            "end_learning_rate": 1.0,
            "total_iters": 2,
        },
        {"scheduler": "Constant", "learning_rate": 0.5, "total_iters": 3},
        {
            "scheduler": "Exponential",
            "initial_learning_rate": 0.5,
            "total_iters": 1,
            "decay_rate": 0.5,
        },
    ]
    original = copy.deepcopy(config)
    scheduler = configure_lr_scheduler(optimizer, config)
    assert config == original
    assert type(scheduler) is L.SequentialLR and scheduler._milestones == [2, 5]
    assert _series(optimizer, scheduler, 7) == pytest.approx([0.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.25])
    assert type(configure_lr_scheduler(_sgd(), config[1:2])) is L.ConstantLR


def test_main_scheduler_chained(cpu_backend):
    optimizer = _sgd()
    config = [
        {
            "scheduler": "Step",
            "initial_learning_rate": 1.0,
            "step_size": 2,
            "gamma": 0.5,
            "main_scheduler": "chained",
        },
        {
            "scheduler": "Exponential",
            "initial_learning_rate": 2.0,
            "total_iters": 1,
            "decay_rate": 0.5,
        },
    ]
    scheduler = configure_lr_scheduler(optimizer, config)
    assert type(scheduler) is L.ChainedScheduler
    assert _series(optimizer, scheduler, 4) == pytest.approx([1.0, 0.5, 0.125, 0.0625])
    with pytest.raises(ValueError, match="not supported with lr scaling"):
        configure_lr_scheduler(_sgd(), config, adjust_learning_rate={"bias": 0.5})
    conflicting = copy.deepcopy(config)
    conflicting[1]["main_scheduler"] = "sequential"
    with pytest.raises(ValueError, match="conflicting `main_scheduler`"):
        configure_lr_scheduler(_sgd(), conflicting)


def test_adjust_learning_rate_wraps_in_scale_per_param(cpu_backend):
    optimizer = cstorch.optim.SGD(
        [{"params": _params(), "adjust_learning_rate": 0.5}, {"params": _params()}], lr=0.1
    )
    scheduler = configure_lr_scheduler(optimizer, 0.2, adjust_learning_rate={"dense": 0.5})
    assert type(scheduler) is L.ScalePerParamLR
    assert [v.item() for v in scheduler.get_last_lr()] == pytest.approx([0.1, 0.2])
    sequential = configure_lr_scheduler(
        optimizer,
        [
            {"scheduler": "Constant", "learning_rate": 0.2, "total_iters": 1},
            {"scheduler": "Constant", "learning_rate": 0.4},
        ],
        adjust_learning_rate={"x": 1},
    )
    assert type(sequential) is L.ScalePerParamLR
    assert type(sequential._scheduler_nested) is L.SequentialLR


@pytest.mark.parametrize(
    "config,message",
    [
        (
            {
                "scheduler": "linear",
                "initial_learning_rate": 1.0,
                "end_learning_rate": 0.0,
                "steps": 10,
            },
            "expected: total_iters, actual: steps",
        ),
        (
            {
                "scheduler": "linear",
                "initial_learning_rate": 1.0,
                "end_learning_rate": 0.0,
                "decay_steps": 10,
            },
            "expected: total_iters, actual: decay_steps",
        ),
        (
            {
                "scheduler": "exponential",
                "learning_rate": 1.0,
                "total_iters": 10,
                "decay_rate": 0.5,
            },
            "expected: initial_learning_rate, actual: learning_rate",
        ),
        (
            {"scheduler": "cyclic", "learning_rate": 0.1, "max_lr": 1.0},
            "expected: base_lr, actual: learning_rate",
        ),
        (
            {"scheduler": "PiecewiseConstant", "values": [0.1, 0.01], "milestones": [3]},
            "expected: learning_rates, actual: values",
        ),
        (
            {
                "scheduler": "MultiStep",
                "initial_learning_rate": 1.0,
                "gamma": 0.5,
                "boundaries": [3],
            },
            "expected: milestones, actual: boundaries",
        ),
        (
            {"scheduler": "CosineAnnealing", "initial_learning_rate": 1.0, "t_max": 5},
            "expected: T_max, actual: t_max",
        ),
    ],
)
def test_deprecated_scheduler_keys(config, message, cpu_backend):
    with pytest.raises(ValueError, match=message):
        configure_lr_scheduler(_sgd(), config)


def test_unknown_scheduler_keys_and_names(cpu_backend):
    with pytest.raises(
        ValueError,
        match=r"unexpected parameters: \['warmup'\](.|\n)*"
        r"LinearLR\(optimizer, initial_learning_rate=1.0",
    ):
        configure_lr_scheduler(
            _sgd(),
            {
                "scheduler": "linear",
                "initial_learning_rate": 1.0,
                "end_learning_rate": 0.0,
                "total_iters": 4,
                "warmup": 3,
            },
        )
    with pytest.raises(ValueError, match="Invalid lr_scheduler type.*'nope'"):
        configure_lr_scheduler(_sgd(), {"scheduler": "nope"})
    with pytest.raises(ValueError, match="'scheduler' key"):
        configure_lr_scheduler(_sgd(), {"learning_rate": 0.1})
    with pytest.raises(RuntimeError, match="Failed to configure LinearLR scheduler"):
        configure_lr_scheduler(_sgd(), {"scheduler": "linear", "initial_learning_rate": 1.0})


def test_configure_scheduler_params():
    config = {
        "scheduler": "CosineDecay",
        "initial_learning_rate": 1.0,
        "end_learning_rate": 0.0,
        "total_iters": 10,
    }
    cls, kwargs = configure_scheduler_params(config)
    assert cls is L.CosineDecayLR
    assert kwargs == {"initial_learning_rate": 1.0, "end_learning_rate": 0.0, "total_iters": 10}
    assert config["scheduler"] == "CosineDecay"  # not mutated


# ------------------------------------------------------------------ generic schedulers
def test_configure_scheduler_single_and_nested(cpu_backend):
    optimizer = _sgd()
    linear = configure_scheduler(
        optimizer,
        {"LinearLR": {"initial_learning_rate": 1.0, "end_learning_rate": 0.0, "total_iters": 4}},
    )
    assert type(linear) is L.LinearLR
    config = {
        "SequentialLR": {
            "schedulers": [
                {
                    "LinearLR": {
                        "initial_learning_rate": 0.0,
                        "end_learning_rate": 1.0,
                        "total_iters": 2,
                    }
                },
                {"StepLR": {"initial_learning_rate": 1.0, "step_size": 1, "gamma": 0.5}},
            ]
        }
    }
    original = copy.deepcopy(config)
    sequential = configure_scheduler(optimizer, config)
    assert config == original
    assert type(sequential) is L.SequentialLR and sequential._milestones == [2]
    assert _series(optimizer, sequential, 5) == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.25])
    chained = configure_scheduler(
        _sgd(),
        {
            "ChainedLR": {
                "schedulers": [
                    {"ConstantLR": {"learning_rate": 0.5}},
                    {"StepLR": {"initial_learning_rate": 1.0, "step_size": 1, "gamma": 0.5}},
                ]
            }
        },
    )
    assert type(chained) is L.ChainedLR
    scaled = configure_scheduler(
        _sgd(), {"ScalePerParamLR": {"scheduler": {"ConstantLR": {"learning_rate": 0.5}}}}
    )
    assert type(scaled) is L.ScalePerParamLR
    piecewise = configure_scheduler(
        _sgd(), {"PiecewiseConstantWD": {"vals": [0.1, 0.01], "milestones": [2]}}
    )
    assert type(piecewise) is WD.PiecewiseConstantWD


def test_configure_scheduler_tags(cpu_backend):
    optimizer = cstorch.optim.SGD(
        [{"params": _params(), "tags": "enc"}, {"params": _params()}], lr=0.1
    )
    sequential = configure_scheduler(
        optimizer,
        {
            "SequentialLR": {
                "param_group_tags": "enc",
                "schedulers": [
                    {"ConstantLR": {"learning_rate": 0.5, "total_iters": 1}},
                    {"ConstantLR": {"learning_rate": 0.2}},
                ],
            }
        },
    )
    assert all(s.param_group_tags == {"enc"} for s in sequential._schedulers)
    assert sequential.get_last_lr()[1] is None
    with pytest.raises(ValueError, match="non-main scheduler ConstantLR"):
        configure_scheduler(
            optimizer,
            {
                "ChainedLR": {
                    "schedulers": [
                        {"ConstantLR": {"learning_rate": 0.5, "param_group_tags": "enc"}}
                    ]
                }
            },
        )


def test_configure_scheduler_errors(cpu_backend):
    with pytest.raises(ValueError, match=r"Invalid scheduler type.*Got: \(linearlr\)"):
        configure_scheduler(_sgd(), {"linearlr": {}})  # names are case-sensitive
    with pytest.raises(ValueError, match="exactly one key"):
        configure_scheduler(_sgd(), {"ConstantLR": {}, "StepLR": {}})
    with pytest.raises(ValueError, match="'schedulers'"):
        configure_scheduler(_sgd(), {"SequentialLR": {}})
    with pytest.raises(ValueError, match="exactly 1 scheduler"):
        configure_scheduler(_sgd(), {"ScalePerParamLR": {"scheduler": []}})


def test_helpers_are_exported():
    for name in [
        "configure_optimizer",
        "configure_optimizer_params",
        "configure_lr_scheduler",
        "configure_scheduler",
        "configure_scheduler_params",
    ]:
        assert callable(getattr(cstorch.optim, name))


def test_a_string_hyperparameter_is_named():
    params = torch.nn.Linear(2, 2).parameters()
    with pytest.raises(TypeError, match="Invalid learning rate: 'fast' - should be a number"):
        cstorch.optim.SGD(params, lr="fast")
