"""``run_cstorch_flow``: the 1.8/1.9 Model Zoo flow written with the experimental cstorch
API (``runconfig.experimental_api: true``).

The model function returns a plain ``nn.Module`` whose call returns the loss. Training
builds the optimizer and LR scheduler from the ``optimizer:`` section
(``configure_optimizer`` / ``configure_lr_scheduler``, 1.x names), scales the loss when
``loss_scaling_factor`` is not 1.0 (``amp.optimizer_step`` with the configured clipping),
logs every ``log_steps``, checks the loss, writes TensorBoard summaries and saves
``checkpoint_<step>.mdl`` every ``checkpoint_steps``. Evaluation loads ``checkpoint_path``
and reports the average loss and the metrics.
"""

from __future__ import annotations

import logging
import math
import os

import torch

from modelzoo.common.pytorch.utils import (
    RunConfigParamsValidator,
    group_optimizer_params,
    setup_logging,
    trainable_named_parameters,
)
from modelzoo.common.run_utils.utils import DeviceType


def run_cstorch_flow(params, model_fn, train_data_fn, eval_data_fn):
    """Configures the run and trains or evaluates (returns the per-step losses)."""
    import cerebras_pytorch.experimental as cstorch

    runconfig = params["runconfig"]
    RunConfigParamsValidator().validate(runconfig)
    mode = runconfig["mode"]
    if mode not in ("train", "eval"):
        raise ValueError(
            f"The experimental_api flow runs mode train or eval, got {mode!r}; "
            "drop experimental_api to use the runner classes."
        )
    cstorch.configure(
        model_dir=runconfig["model_dir"],
        compile_dir=runconfig.get("compile_dir"),
        compile_only=bool(runconfig.get("compile_only")),
        validate_only=bool(runconfig.get("validate_only")),
        checkpoint_steps=runconfig.get("checkpoint_steps") or 0,
        seed=runconfig.get("seed"),
        num_csx=runconfig.get("num_csx"),
        max_wgt_servers=runconfig.get("num_wgt_servers"),
    )
    setup_logging(runconfig.get("logging"), logging_dir=runconfig["model_dir"])
    backend = (
        "WSE_WS"
        if runconfig.get("target_device") == DeviceType.CSX
        else (runconfig.get("target_device") or "CPU")
    )
    if mode == "train":
        return _train(cstorch, params, model_fn, train_data_fn, backend)
    return _evaluate(cstorch, params, model_fn, eval_data_fn, backend)


def _check_loss(value: float):
    if math.isnan(value):
        raise ValueError(
            "NaN loss detected. Please try different hyperparameters such as the "
            "learning rate, batch size, etc."
        )
    if math.isinf(value):
        raise ValueError("inf loss detected.")


def _train(cstorch, params, model_fn, input_fn, backend):
    from cstorch.utils.tensorboard import SummaryWriter

    runconfig = params["runconfig"]
    model_dir = runconfig["model_dir"]
    log_steps = runconfig.get("log_steps") or 1
    checkpoint_steps = runconfig.get("checkpoint_steps") or 0
    oparams = dict(params["optimizer"])

    model = model_fn(params)
    compiled_model = cstorch.compile(model, backend=backend)
    compiled_model.train()
    no_decay, named = trainable_named_parameters(model)
    groups = [
        g
        for g in group_optimizer_params(named, no_decay, oparams.get("weight_decay_rate", 0.0))
        if g["params"]
    ]
    optimizer_type = oparams.pop("optimizer_type")
    learning_rate = oparams.get("learning_rate")
    if isinstance(learning_rate, (dict, list)):
        oparams["learning_rate"] = 0.1  # the scheduler sets it
    optimizer = cstorch.optim.configure_optimizer(optimizer_type, groups, **oparams)
    lr_scheduler = cstorch.optim.configure_lr_scheduler(
        optimizer, learning_rate if isinstance(learning_rate, (dict, list)) else None
    )
    scale = oparams.get("loss_scaling_factor", 1.0)
    grad_scaler = (
        None
        if scale in (1.0, None)
        else cstorch.amp.GradScaler(
            loss_scale=scale,
            init_scale=oparams.get("initial_loss_scale"),
            steps_per_increase=oparams.get("steps_per_increase"),
            min_loss_scale=oparams.get("min_loss_scale"),
            max_loss_scale=oparams.get("max_loss_scale"),
        )
    )
    max_norm, max_value = oparams.get("max_gradient_norm"), oparams.get("max_gradient_value")

    global_step = 0
    if runconfig.get("checkpoint_path"):
        state = cstorch.load(runconfig["checkpoint_path"])
        model.load_state_dict(state["model"])
        if not runconfig.get("is_pretrained_checkpoint", False):
            optimizer.load_state_dict(state["optimizer"])
            if lr_scheduler is not None and "lr_scheduler" in state:
                lr_scheduler.load_state_dict(state["lr_scheduler"])
            if grad_scaler is not None and "grad_scaler" in state:
                grad_scaler.load_state_dict(state["grad_scaler"])
            global_step = int(state.get("global_step", 0))

    @cstorch.step_closure
    def save_checkpoint(step):
        path = os.path.join(model_dir, f"checkpoint_{step}.mdl")
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "global_step": step,
        }
        if lr_scheduler is not None:
            state["lr_scheduler"] = lr_scheduler.state_dict()
        if grad_scaler is not None:
            state["grad_scaler"] = grad_scaler.state_dict()
        cstorch.save(state, path)  # replaces a rerun's older file atomically
        logging.info(f"Saved checkpoint {path}")

    @cstorch.compile_step
    def training_step(batch):
        loss = compiled_model(batch)
        if grad_scaler is None:
            optimizer.zero_grad()
            loss.backward()
            params_ = [p for g in optimizer.param_groups for p in g["params"]]
            if max_norm:
                torch.nn.utils.clip_grad_norm_(params_, max_norm)
            elif max_value:
                torch.nn.utils.clip_grad_value_(params_, max_value)
            optimizer.step()
        else:
            cstorch.amp.optimizer_step(
                loss,
                optimizer,
                grad_scaler,
                max_gradient_norm=max_norm,
                max_gradient_value=max_value,
            )
        if lr_scheduler is not None:
            lr_scheduler.step()
        return loss

    writer = SummaryWriter(log_dir=os.path.join(model_dir, "train"))
    losses = []

    @cstorch.step_closure
    def post_training_step(loss, step):
        value = loss.item()
        losses.append(value)
        _check_loss(value)
        if step % log_steps == 0:
            logging.info(f"| Train: {compiled_model.backend.name} Step={step}, Loss={value:.5f}")
        writer.add_scalar("loss", value, step)
        cstorch.save_summaries(writer, step)

    dataloader = cstorch.utils.data.DataLoader(
        input_fn,
        params,
        initial_step=global_step,
        num_steps=runconfig.get("num_steps"),
        max_steps=runconfig.get("max_steps"),
        num_epochs=runconfig.get("num_epochs"),
        steps_per_epoch=runconfig.get("steps_per_epoch"),
    )
    if runconfig.get("save_initial_checkpoint", False):
        save_checkpoint(global_step)
    for _epoch in range(dataloader.num_epochs):
        for batch in dataloader:
            loss = training_step(batch)
            global_step += 1
            post_training_step(loss, global_step)
            if checkpoint_steps and global_step % checkpoint_steps == 0:
                save_checkpoint(global_step)
    writer.close()
    logging.info("Training Completed Successfully!")
    return losses


def _evaluate(cstorch, params, model_fn, input_fn, backend):
    runconfig = params["runconfig"]
    model = model_fn(params)
    compiled_model = cstorch.compile(model, backend=backend)
    compiled_model.eval()
    global_step = 0
    if runconfig.get("checkpoint_path"):
        state = cstorch.load(runconfig["checkpoint_path"])
        model.load_state_dict(state["model"])
        global_step = int(state.get("global_step", 0))

    @cstorch.compile_step
    @torch.no_grad()
    def eval_step(batch):
        return compiled_model(batch)

    losses = []

    @cstorch.step_closure
    def post_eval_step(loss):
        value = loss.item()
        _check_loss(value)
        losses.append(value)

    dataloader = cstorch.utils.data.DataLoader(
        input_fn, params, num_epochs=1, steps_per_epoch=runconfig.get("eval_steps")
    )
    for batch in dataloader:
        post_eval_step(eval_step(batch))
    metrics = dict(cstorch.metrics.compute_all_metrics())
    for name, value in metrics.items():
        logging.info(f"Metric: {name} = {value}")
    average = sum(losses) / len(losses)
    logging.info(f"Avg Eval Loss: {average} (step {global_step})")
    return losses
