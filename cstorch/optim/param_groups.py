"""``cstorch.optim.configure_param_groups``: the optimizer parameter groups the Model Zoo's run
flow (releases 2.0 to 2.2) builds from its ``optimizer`` config before
``configure_optimizer``.

The trainable parameters are split two ways:

* weight decay: parameters of normalization layers and biases (a name containing "bias")
  get ``weight_decay=0.0``, the others the config's ``weight_decay``;
* learning-rate scaling (muP): ``adjust_learning_rate: {"embedding": s, "decoder_kernel": t}``
  gives embedding weights (``*embedding*weight``) and decoder kernels
  (``*decoder*dense*weight``, ``*decoder*linear*weight``) groups whose
  ``adjust_learning_rate`` is that factor (the others 1.0), read by ``ScalePerParamLR``
  (``configure_lr_scheduler(..., adjust_learning_rate)``).

Empty groups are left out. A model may name its own scaled layers with an attribute
``lr_adjustment_groups``: ``{layer_type: glob or list of globs}``.
"""

from __future__ import annotations

import fnmatch

import torch

from jax_backend.errors import CstorchTypeError, CstorchValueError

_NORMS = (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm)
if hasattr(torch.nn, "RMSNorm"):
    _NORMS += (torch.nn.RMSNorm,)

DEFAULT_LR_ADJUSTMENT_GROUPS = {
    "embedding": ["*embedding*weight"],
    "decoder_kernel": ["*decoder*dense*weight", "*decoder*linear*weight"],
}


def _norm_parameter_names(model: torch.nn.Module) -> set:
    names = set()
    for module_name, module in model.named_modules():
        if isinstance(module, _NORMS):
            prefix = f"{module_name}." if module_name else ""
            names.update(prefix + n for n, _ in module.named_parameters(recurse=False))
    return names


def _lr_scale(name: str, adjust: dict, layer_globs: dict) -> float:
    for layer_type, scale in adjust.items():
        globs = layer_globs.get(layer_type)
        if globs is None:
            raise CstorchValueError(
                f"adjust_learning_rate names layer type {layer_type!r}, which the model does "
                f"not define; known: {sorted(layer_globs)}."
            )
        if isinstance(globs, str):
            globs = [globs]
        if any(fnmatch.fnmatchcase(name, g) for g in globs):
            return float(scale)
    return 1.0


def configure_param_groups(model: torch.nn.Module, optimizer_params: dict) -> list:
    """The parameter groups (list of dicts with ``params``, ``weight_decay`` and, where
    ``adjust_learning_rate`` is configured, ``adjust_learning_rate``) for ``model``."""
    if not isinstance(model, torch.nn.Module):
        raise CstorchTypeError(
            f"configure_param_groups expects a torch.nn.Module, got {type(model).__name__}."
        )
    weight_decay = optimizer_params.get("weight_decay", 0.0) or 0.0
    adjust = optimizer_params.get("adjust_learning_rate") or {}
    if not isinstance(adjust, dict):
        raise CstorchValueError(
            f"adjust_learning_rate must be a mapping of layer type to factor, got {adjust!r}."
        )
    layer_globs = getattr(model, "lr_adjustment_groups", DEFAULT_LR_ADJUSTMENT_GROUPS)
    no_decay = _norm_parameter_names(model)

    groups: dict[tuple, dict] = {}  # (decays, scale) -> group, in first-seen order
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decays = "bias" not in name and name not in no_decay
        scale = _lr_scale(name, adjust, layer_globs) if adjust else None
        key = (decays, scale)
        if key not in groups:
            group = {"params": [], "weight_decay": weight_decay if decays else 0.0}
            if scale is not None:
                group["adjust_learning_rate"] = scale
            groups[key] = group
        groups[key]["params"].append(param)
    # Decaying groups first, as the reference orders them.
    return [groups[k] for k in sorted(groups, key=lambda k: not k[0])]
