"""``PyTorchBaseModel``: the 1.x wrapper around a model, its optimizer and LR scheduler.

1.8/1.9: ``PyTorchBaseModel(params, model_fn, device)`` builds ``model_fn(params)`` (a plain
``nn.Module`` whose call returns the loss). 1.6/1.7: a subclass builds ``self.model`` and
calls ``super().__init__(params=params, model=self.model, device=device)``; both work.

The module is registered with the current cstorch backend (``cstorch.compile``), so its
parameters live on the engine between steps. In train modes the ``optimizer:`` section of
the params builds a cstorch optimizer (1.x parameter names accepted: ``weight_decay_rate``,
``beta1``/``beta2``, ``use_nesterov``, ...; biases and normalization layers get no weight
decay) and, from ``learning_rate``, a cstorch LR scheduler (a float, one scheduler dict, or
a list of them run one after another). ``loss_scaling_factor`` other than 1.0 (a number, or
"dynamic") builds a ``cstorch.amp.GradScaler``; ``max_gradient_norm`` /
``max_gradient_value`` become ``optimizer.gradient_clipper``.
"""

from __future__ import annotations

import logging

import torch

import cstorch
from cerebras_pytorch.experimental import optim as legacy_optim
from modelzoo.common.pytorch import modes
from modelzoo.common.pytorch.half_dtype import half_dtype_instance
from modelzoo.common.pytorch.utils import group_optimizer_params, trainable_named_parameters


class GradientClipper:
    """Clips gradients by global norm or by value (0 or None turns a bound off)."""

    def __init__(self, max_gradient_norm=0.0, max_gradient_value=0.0):
        self.max_gradient_norm = max_gradient_norm or 0.0
        self.max_gradient_value = max_gradient_value or 0.0
        if self.max_gradient_norm < 0 or self.max_gradient_value < 0:
            raise ValueError(
                f"max_gradient_norm and max_gradient_value must be non-negative, "
                f"got {max_gradient_norm} and {max_gradient_value}."
            )
        if self.max_gradient_norm and self.max_gradient_value:
            raise ValueError(
                "Gradients can be clipped by norm or by value, but not both: set "
                "only one of max_gradient_norm and max_gradient_value."
            )

    def __call__(self, params):
        params = list(params)
        if self.max_gradient_norm:
            torch.nn.utils.clip_grad_norm_(params, self.max_gradient_norm)
        elif self.max_gradient_value:
            torch.nn.utils.clip_grad_value_(params, self.max_gradient_value)


class PyTorchBaseModel:
    """A model, its optimizer, LR scheduler and loss scaler, configured from the params."""

    def __init__(
        self,
        params: dict,
        model_fn=None,
        device: torch.device = None,
        *,
        model: torch.nn.Module = None,
    ):
        if isinstance(model_fn, torch.nn.Module):  # 1.6/1.7: (params, model, device)
            model, model_fn = model_fn, None
        if model is None:
            if model_fn is None:
                raise TypeError(
                    "PyTorchBaseModel needs model_fn (a callable returning an nn.Module) or model."
                )
            model = model_fn(params)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model_fn must return a torch.nn.Module, got {type(model).__name__}.")
        model_params = params.get("model") or {}
        if "mixed_precision" not in model_params:
            raise ValueError(
                "The params' model section needs `mixed_precision: true|false` "
                "(the 1.x runners require it)."
            )
        half_dtype_instance.use_bfloat16 = bool(model_params.get("use_bfloat16", False))

        self.torch_model = model
        self.model = model
        self.device = device
        self.mode = params["runconfig"]["mode"]
        self.mixed_precision = model_params["mixed_precision"]
        self.is_pretrained_checkpoint = params["runconfig"].get("is_pretrained_checkpoint", False)
        self.compiled_model = cstorch.compile(model, cstorch.backend())

        oparams = dict(params.get("optimizer") or {})
        self.optimizer = None
        self.lr_scheduler = None
        self.grad_scaler = None
        if self.mode in (modes.TRAIN, modes.TRAIN_AND_EVAL):
            if "optimizer_type" not in oparams:
                raise ValueError(
                    "Training needs an `optimizer:` section with `optimizer_type` "
                    "(e.g. SGD, Adam, AdamW) and `learning_rate`."
                )
            learning_rate = oparams.get("learning_rate")
            if not isinstance(learning_rate, (float, int, str, dict, list)) or isinstance(
                learning_rate, bool
            ):
                raise ValueError(
                    f"optimizer.learning_rate must be a float, a dict, or a list "
                    f"of dicts. Got {learning_rate!r}."
                )
            self.optimizer = self._configure_optimizer(oparams)
            self.lr_scheduler = legacy_optim.configure_lr_scheduler(
                self.optimizer, learning_rate if isinstance(learning_rate, (dict, list)) else None
            )
            self.optimizer.gradient_clipper = GradientClipper(
                oparams.get("max_gradient_norm"), oparams.get("max_gradient_value")
            )
            self.grad_scaler = self._configure_grad_scaler(oparams)

    def _configure_optimizer(self, oparams: dict):
        oparams = dict(oparams)
        optimizer_type = oparams.pop("optimizer_type")
        if isinstance(oparams.get("learning_rate"), (dict, list)):
            oparams["learning_rate"] = 0.1  # the scheduler sets the learning rate
        no_decay, named = self.trainable_named_parameters()
        groups = group_optimizer_params(named, no_decay, oparams.get("weight_decay_rate", 0.0))
        groups = [g for g in groups if g["params"]]
        kwargs = legacy_optim.translate_optimizer_params(optimizer_type, oparams)
        if "weight_decay" not in kwargs:  # the optimizer has no weight decay parameter
            for group in groups:
                group.pop("weight_decay")
        return cstorch.optim.configure_optimizer(optimizer_type, groups, **kwargs)

    @staticmethod
    def _configure_grad_scaler(oparams: dict):
        scale = oparams.get("loss_scaling_factor", 1.0)
        if scale in (1.0, None):
            return None
        if scale == "dynamic" and half_dtype_instance.use_bfloat16:
            logging.info("No need for dynamic loss scaling with bfloat16; not scaling the loss.")
            return None
        return cstorch.amp.GradScaler(
            loss_scale=scale,
            init_scale=oparams.get("initial_loss_scale"),
            steps_per_increase=oparams.get("steps_per_increase"),
            min_loss_scale=oparams.get("min_loss_scale"),
            max_loss_scale=oparams.get("max_loss_scale"),
        )

    # ------------------------------------------------------------------ queries
    def train(self):
        self.model.train()

    def eval(self):
        self.model.eval()

    @property
    def supported_modes(self):
        return [modes.TRAIN, modes.EVAL, modes.TRAIN_AND_EVAL, modes.EVAL_ALL]

    @property
    def supported_cs_modes(self):
        return [modes.TRAIN, modes.EVAL, modes.EVAL_ALL]

    @property
    def supported_non_cs_modes(self):
        return self.supported_modes

    def supports_mode(self, mode) -> bool:
        return mode in (
            self.supported_cs_modes if cstorch.use_cs() else self.supported_non_cs_modes
        )

    def trainable_named_parameters(self):
        return trainable_named_parameters(self.model)

    def get_optimizer(self):
        return self.optimizer

    def get_lr_scheduler(self):
        return self.lr_scheduler

    # ------------------------------------------------------------------ state
    def get_state(self, keep_vars=False) -> dict:
        """``{"model", "optimizer", "lr_scheduler", "amp", "state_version": 0.2}``."""
        state = {"model": self.model.state_dict(keep_vars=keep_vars), "state_version": 0.2}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        if self.lr_scheduler is not None:
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        if self.grad_scaler is not None:
            state["amp"] = self.grad_scaler.state_dict()
        return state

    def set_state(self, state: dict, strict: bool = True) -> None:
        """Loads a ``get_state()`` dict. A pretrained checkpoint loads the weights only
        (non-strictly outside eval); 0.1-format checkpoints of a model with a ``.model``
        submodule load into it, as 1.x did."""
        if "model" not in state:
            raise KeyError(
                f"The checkpoint has no 'model' entry (found {sorted(state)}); it "
                "was not written by a 1.x runner or PyTorchBaseModel.get_state()."
            )
        if self.is_pretrained_checkpoint and self.mode != modes.EVAL:
            strict = False
        model = self.torch_model
        if hasattr(model, "model") and state.get("state_version", 0.1) == 0.1:
            model = model.model
        model.load_state_dict(state["model"], strict=strict)
        if self.is_pretrained_checkpoint:
            return
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
            if self.lr_scheduler is not None and "lr_scheduler" in state:
                self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        scaler_state = state.get("amp", state.get("scaler"))
        if self.grad_scaler is not None and scaler_state:
            self.grad_scaler.load_state_dict(scaler_state)

    def __call__(self, *args, **kwargs):
        """One batch through the model: the loss (or outputs holding it)."""
        return self.model(*args, **kwargs)
