"""``run``: the entry point of Model Zoo 1.x ``run.py`` scripts.

::

    from modelzoo.common.pytorch.run_utils import run

    def main():
        run(model_fn, train_data_fn, eval_data_fn, default_params_fn)

``run`` parses either command line (1.8/1.9 ``python run.py CPU -p params.yaml -m train``
or 1.6/1.7 ``python run.py -p params.yaml -m train -cpu``, see ``cli_parser``), applies
``default_params_fn``, validates ``runconfig`` and runs the mode: ``train``, ``eval``,
``train_and_eval`` (CPU/GPU) or ``eval_all`` (one evaluation per ``checkpoint_<step>.mdl``
in ``model_dir``). ``runconfig.experimental_api: true`` runs the 1.8 cstorch flow instead of
the runner classes. ``run(..., runner_cls=MyRunner)`` uses a custom runner subclass.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from typing import Any, Callable, Dict, List, Optional

import torch
import yaml

from modelzoo.common.pytorch import modes
from modelzoo.common.pytorch.half_dtype import half_dtype_instance
from modelzoo.common.pytorch.pytorch_base_runner import PyTorchBaseRunner
from modelzoo.common.pytorch.utils import RunConfigParamsValidator, setup_logging
from modelzoo.common.run_utils.cli_parser import get_params_from_args
from modelzoo.common.run_utils.utils import DeviceType  # 1.x re-export

DATA_FN_TYPE = Callable[[dict], torch.utils.data.DataLoader]


def run(
    model_fn: Callable,
    train_data_fn: Optional[DATA_FN_TYPE] = None,
    eval_data_fn: Optional[DATA_FN_TYPE] = None,
    default_params_fn: Optional[Callable[[dict], dict]] = None,
    extra_args_parser_fn: Optional[Callable[[], List[argparse.ArgumentParser]]] = None,
    *,
    runner_cls=None,
    argv: Optional[List[str]] = None,
):
    """Runs a model from the command line (``argv`` defaults to ``sys.argv[1:]``)."""
    caller = inspect.currentframe().f_back.f_code.co_filename
    run_dir = os.path.dirname(os.path.abspath(caller))
    params = get_params_from_args(
        run_dir, sys.argv[1:] if argv is None else argv, extra_args_parser_fn
    )
    if default_params_fn:
        params = default_params_fn(params) or params
    try:  # a mistake in the params file is a command-line error: one line, exit status 2
        RunConfigParamsValidator().validate(params["runconfig"])
    except ValueError as error:
        print(f"{os.path.basename(caller)}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    return run_with_params(params, model_fn, train_data_fn, eval_data_fn, runner_cls=runner_cls)


def run_with_params(
    params: Dict[str, Any],
    model_fn: Callable,
    train_data_fn: Optional[DATA_FN_TYPE] = None,
    eval_data_fn: Optional[DATA_FN_TYPE] = None,
    *,
    runner_cls=None,
):
    """Runs the mode of ``params["runconfig"]`` (the part of ``run`` after parsing)."""
    runconfig = params["runconfig"]
    if runconfig.get("experimental_api", False):
        from modelzoo.common.pytorch.run_cstorch_flow import run_cstorch_flow

        return run_cstorch_flow(params, model_fn, train_data_fn, eval_data_fn)
    return run_base_model_flow(params, model_fn, train_data_fn, eval_data_fn, runner_cls=runner_cls)


def _loader(data_fn, params, what):
    if data_fn is None:
        raise ValueError(f"{what} dataloader function has not been provided to run().")
    return data_fn(params)


def run_base_model_flow(params, model_fn, train_data_fn, eval_data_fn, *, runner_cls=None):
    """The runner-class flow: creates the runner and runs the mode."""
    runconfig = params["runconfig"]
    RunConfigParamsValidator().validate(runconfig)
    mode = runconfig["mode"]
    if not modes.is_valid(mode):
        raise ValueError(
            f"Mode {mode!r} is not supported; use one of train, eval, train_and_eval, eval_all."
        )
    if "seed" in runconfig:
        torch.manual_seed(runconfig["seed"])
    setup_logging(
        runconfig.get("logging"),
        runconfig.get("streamer_logging"),
        logging_dir=runconfig.get("model_dir"),
    )
    # The documented way to use a custom runner is to replace ``create(model_fn, params)``:
    # call it with exactly those two arguments unless run(..., runner_cls=) was used.
    if runner_cls is None:
        runner = PyTorchBaseRunner.create(model_fn, params)
    else:
        runner = PyTorchBaseRunner.create(model_fn, params, runner_cls=runner_cls)

    summary_dir = os.path.join(runconfig["model_dir"], mode)
    os.makedirs(summary_dir, exist_ok=True)
    with open(os.path.join(summary_dir, f"params_{mode}.yaml"), "w") as fout:
        yaml.dump(params, fout, default_flow_style=False)

    from modelzoo.common.pytorch.pytorch_dist_runner import PyTorchDistRunner

    takes_functions = isinstance(runner, PyTorchDistRunner)  # 1.x: it takes data functions
    train = (
        (lambda: train_data_fn)
        if takes_functions
        else (lambda: _loader(train_data_fn, params, "Train"))
    )
    evaluation = (
        (lambda: eval_data_fn)
        if takes_functions
        else (lambda: _loader(eval_data_fn, params, "Eval"))
    )
    if mode == modes.TRAIN:
        return runner.train(train())
    if mode == modes.EVAL:
        return runner.evaluate(evaluation())
    if mode == modes.TRAIN_AND_EVAL:
        return runner.train_and_eval(train(), evaluation())
    if mode == modes.EVAL_ALL:
        return runner.eval_all(evaluation())
    raise ValueError(f"Mode {mode} is not supported.")


__all__ = ["run", "run_with_params", "run_base_model_flow", "half_dtype_instance", "DeviceType"]
