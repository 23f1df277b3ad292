"""One run of the registry sweep (``tools/zoo_sweep.py``): a Model Zoo model trained a few
steps from a tiny ``trainer:`` config, either through a ``Trainer`` built in Python or through
the zoo's own command line (``cszoo fit``), recording each step's loss.

Runs unchanged on cerebras-pytorch 2.10 (the reference) and on this project; it needs only
``cerebras.pytorch`` and the zoo's ``src`` on ``sys.path``.

    python tests/zoo/sweep_worker.py --config tiny.yaml --how python --device CPU \\
        --precision fp32 --steps 3 --model-dir DIR --out result.json

Writes ``{"losses": [...], "loss_scales": [...], "error": null | {"type", "message",
"where"}}``. ``--precision fp32`` turns mixed precision off; ``shipped`` keeps the config's.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import traceback

LEARNING_RATE = 1e-3  # constant: the runs compare steps, not schedules
DATA_SEED = 1234


def _numpy_cast():
    import numpy as np

    if not hasattr(np, "cast"):
        # The zoo's dummy GPT data calls np.cast["int32"](x), removed in numpy 2 (which JAX
        # requires); give that one helper back so the zoo's own fake data can be used.
        np.cast = {
            name: (lambda x, name=name: np.asarray(x, dtype=name))
            for name in ("int32", "int64", "float32")
        }


def _phase(params):
    trainer = params["trainer"]
    return trainer[0]["trainer"] if isinstance(trainer, list) else trainer


def _precision_kwargs(init, precision):
    if precision == "fp32":
        return {"enabled": False}
    kwargs = dict(init.get("precision") or {})
    kwargs.pop("precision_opt_level", None)
    return kwargs


def _recorder(result):
    import torch

    import cerebras.pytorch as cstorch
    from cerebras.modelzoo.trainer.callbacks import Callback

    class RecordLosses(Callback):
        def on_train_start(self, trainer, model, train_dataloader, loop, loop_idx):
            # Data-side random draws (DiT's noise and timesteps) start from one state in
            # every run: torch versions' initialisers consume the generator differently.
            torch.manual_seed(DATA_SEED)

        def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
            scaler = getattr(trainer.precision, "scaler", None)
            scale = (
                scaler.get_scale()
                if scaler is not None and getattr(scaler, "dynamic", False)
                else None
            )
            self.record(outputs["loss"], scale)

        @cstorch.step_closure
        def record(self, loss, scale):
            result["losses"].append(float(loss))
            if scale is not None:
                result["loss_scales"].append(float(scale))

    return RecordLosses()


def _config_for(model_cls, config: dict, model_config=None):
    """The config object of a zoo model or data processor (the class its ``__init__``
    annotates ``config`` with), as a zoo user builds it; the dict where it takes one.
    ``model_config``: a data config is validated knowing the model's config, as the zoo's
    YAML path does (some processors, e.g. DiT's, read model fields from that context)."""
    import inspect
    import typing

    try:
        hint = typing.get_type_hints(model_cls.__init__).get("config")
    except Exception:  # noqa: BLE001 - unresolvable annotations: pass the dict
        hint = inspect.signature(model_cls.__init__).parameters.get("config")
        hint = getattr(hint, "annotation", None)
    if inspect.isclass(hint) and hasattr(hint, "model_fields"):
        if model_config is not None and hasattr(model_config, "model_fields"):
            return hint.model_validate(config, context={"model": {"config": model_config}})
        return hint(**config)
    return config


def _optimizer_class(cstorch, name):
    """The optimizer a config names (case-insensitively, as the zoo's YAML reads it)."""
    for attr in dir(cstorch.optim):
        value = getattr(cstorch.optim, attr)
        if attr.lower() == name.lower() and isinstance(value, type):
            return value
    raise ValueError(f"cerebras.pytorch.optim has no optimizer named {name!r}")


def _accepted(cls, kwargs):
    """The keywords ``cls`` takes (YAML-only optimizer options such as
    ``adjust_learning_rate``, which the zoo turns into parameter groups, are left out)."""
    import inspect

    names = set(inspect.signature(cls.__init__).parameters) - {"params"}  # YAML groups
    return {k: v for k, v in kwargs.items() if k in names}


def _replayed(make_loader, path, steps):
    """A loader of the batches stored at ``path``; the first run to ask stores the first
    ``steps`` batches of ``make_loader()`` there (drawn after seeding torch with
    ``DATA_SEED``, as training does). For data whose random draws differ between torch
    versions (``torch.randn`` in bfloat16 changed after torch 2.4), so that the reference
    and this project train on the same numbers."""
    import torch

    if not os.path.exists(path):
        torch.manual_seed(DATA_SEED)
        batches = []
        for batch in make_loader():
            batches.append(batch)
            if len(batches) == steps:
                break
        torch.save(batches, path)
    batches = torch.load(path, weights_only=True)
    return torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)


def run_python(
    params,
    device,
    precision,
    steps,
    model_dir,
    result,
    init_ckpt=None,
    save_init=None,
    batches=None,
):
    """A Trainer built in Python from the tiny config, as a zoo user would write it.
    ``batches``: train on stored batches (``_replayed``) instead of the processor's.
    ``save_init`` writes the freshly built model's weights (a checkpoint with ``"model"``);
    ``init_ckpt`` starts from such a checkpoint (the Trainer's ``fit(ckpt_path=)``)."""
    from cerebras.modelzoo.registry import registry

    import cerebras.pytorch as cstorch
    from cerebras.modelzoo.trainer import Trainer
    from cerebras.modelzoo.trainer.callbacks import MixedPrecision, TrainingLoop

    phase = _phase(params)
    init, fit = phase["init"], phase["fit"]
    model_config = copy.deepcopy(init["model"])
    model_cls = registry.get_model_class(model_config["name"])
    ((opt_name, opt_kwargs),) = init["optimizer"].items()
    opt_kwargs = dict(opt_kwargs or {})
    opt_kwargs.pop("learning_rate", None)
    opt_kwargs.pop("lr", None)
    data_config = copy.deepcopy(fit["train_dataloader"])
    data_cls = registry.get_data_processors_map(model_config["name"])[data_config["data_processor"]]

    def loader():
        model_config_object = _config_for(model_cls, copy.deepcopy(model_config))

        def processor_loader():
            return data_cls(
                _config_for(data_cls, copy.deepcopy(data_config), model_config_object)
            ).create_dataloader()

        if batches:
            return cstorch.utils.data.DataLoader(
                lambda: _replayed(processor_loader, batches, steps)
            )
        return cstorch.utils.data.DataLoader(processor_loader)

    def build_model():
        model = model_cls(_config_for(model_cls, copy.deepcopy(model_config)))
        if save_init:
            cstorch.save({"model": model.state_dict()}, save_init)
        return model

    trainer = Trainer(
        device=device,
        model_dir=model_dir,
        model=build_model,
        optimizer=lambda model: _optimizer_class(cstorch, opt_name)(
            model.parameters(),
            lr=LEARNING_RATE,
            **_accepted(_optimizer_class(cstorch, opt_name), opt_kwargs),
        ),
        precision=MixedPrecision(**_precision_kwargs(init, precision)),
        loop=TrainingLoop(num_steps=steps, eval_frequency=None),
        callbacks=[_recorder(result)],
        seed=init.get("seed", 1),
    )
    trainer.fit(loader(), ckpt_path=init_ckpt)


def run_yaml(params, device, precision, steps, model_dir, result, config_path, init_ckpt=None):
    """``cszoo fit params.yaml``: the zoo's own command line on the tiny config."""
    import yaml
    from cerebras.modelzoo.cli.main import main

    from cerebras.modelzoo.trainer.callbacks.callback import register_global_callback

    phase = _phase(params)
    init = phase["init"]
    init.pop("device", None)
    init["backend"] = {"backend_type": device}
    if precision == "fp32":
        init["precision"] = {"enabled": False}
    init["loop"] = {"num_steps": steps, "eval_frequency": None}
    init["model_dir"] = model_dir
    ((opt_name, opt_kwargs),) = init["optimizer"].items()
    init["optimizer"] = {opt_name: {**(opt_kwargs or {}), "learning_rate": LEARNING_RATE}}
    init.pop("schedulers", None)
    if init_ckpt:
        phase["fit"]["ckpt_path"] = init_ckpt
    path = os.path.join(os.path.dirname(os.path.abspath(config_path)), "yaml_run.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"trainer": phase}, f)
    register_global_callback(_recorder(result))
    sys.argv = ["cszoo", "fit", path]
    main()


def _where(error) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    cause = error
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__
        frames = traceback.extract_tb(cause.__traceback__) or frames
    if not frames:
        return "?", error
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno}", cause


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--how", choices=["python", "yaml"], default="python")
    parser.add_argument("--device", choices=["CPU", "CSX"], default="CPU")
    parser.add_argument("--precision", choices=["fp32", "shipped"], default="fp32")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--init", help="start from this checkpoint's model weights")
    parser.add_argument("--save-init", help="save the freshly built model's weights here")
    parser.add_argument(
        "--batches", help="train on the batches stored in this file (the first run stores them)"
    )
    args = parser.parse_args(argv)

    import torch
    import yaml

    torch.set_num_threads(1)  # deterministic CPU reductions, as in the reference run
    _numpy_cast()
    with open(args.config) as f:
        params = yaml.safe_load(f)
    result = {"losses": [], "loss_scales": [], "error": None}
    try:
        if args.how == "python":
            run_python(
                params,
                args.device,
                args.precision,
                args.steps,
                args.model_dir,
                result,
                args.init,
                args.save_init,
                args.batches,
            )
        else:
            run_yaml(
                params,
                args.device,
                args.precision,
                args.steps,
                args.model_dir,
                result,
                args.config,
                args.init,
            )
    except BaseException as error:  # noqa: BLE001 - reported, not hidden
        where, cause = _where(error)
        result["error"] = {
            "type": type(cause).__name__,
            "message": str(cause).strip().splitlines()[0][:300] if str(cause).strip() else "",
            "where": where,
        }
        traceback.print_exc()
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
