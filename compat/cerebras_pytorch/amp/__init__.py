"""``cerebras_pytorch.amp``: cstorch's ``amp`` with what releases 1.6 to 1.9 also had there.

Every cstorch.amp name is cstorch's own object (module attributes are forwarded; submodules
such as ``cerebras_pytorch.amp.grad_scaler`` are cstorch's modules), except:

* ``GradScaler`` is a subclass of cstorch's that also takes the 1.x keywords the 1.x Model
  Zoo passes: ``initial_loss_scale`` (2.x ``init_scale``) and ``mixed_precision`` (1.x's
  GradScaler scaled only in mixed precision: without it the scale is fixed at 1.0);
* 1.6 called the scaler itself on the loss: ``scaler(loss)`` is ``scaler.scale(loss)``;
* the 1.x module functions: ``get_init_params()`` (the keywords the last GradScaler was
  built with), ``state_dict()``/``load_state_dict()`` (the amp state the 1.x runner saves
  in checkpoints: the half dtype) and ``_amp_state.half_dtype`` (``use_bfloat16`` is
  cstorch's own, as 2.0 had it).

It is this package rather than cstorch.amp itself because cstorch's GradScaler must keep its
2.x signature (2.0/2.1 code gets the same object through this name and notices nothing).
"""

from __future__ import annotations

import cstorch.amp as _amp
from cstorch.amp import *  # noqa: F403

_init_params: dict = {}


class GradScaler(_amp.GradScaler):
    def __init__(
        self,
        loss_scale=None,
        init_scale=None,
        steps_per_increase=None,
        min_loss_scale=None,
        max_loss_scale=None,
        overflow_tolerance=0.0,
        max_gradient_norm=None,
        *,
        initial_loss_scale=None,
        mixed_precision=None,
    ):
        if initial_loss_scale is not None:
            if init_scale is not None and init_scale != initial_loss_scale:
                raise ValueError(
                    "Pass one of init_scale and initial_loss_scale (the 1.x "
                    "name), not both with different values."
                )
            init_scale = initial_loss_scale
        if mixed_precision is False:
            loss_scale = 1.0  # 1.x: no loss scaling outside mixed precision
        _init_params.clear()
        _init_params.update(
            loss_scale=loss_scale,
            initial_loss_scale=init_scale,
            steps_per_increase=steps_per_increase,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
            max_gradient_norm=max_gradient_norm,
            mixed_precision=mixed_precision,
        )
        super().__init__(
            loss_scale=loss_scale,
            init_scale=init_scale,
            steps_per_increase=steps_per_increase,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
            overflow_tolerance=overflow_tolerance,
            max_gradient_norm=max_gradient_norm,
        )

    def __call__(self, loss):
        return self.scale(loss)


def get_init_params() -> dict:
    return dict(_init_params)


class _AmpState:
    @property
    def half_dtype(self):
        return _amp.get_half_dtype()


_amp_state = _AmpState()


def state_dict() -> dict:
    return {"half_dtype": _amp.get_half_dtype_str()}


def load_state_dict(state: dict) -> None:
    if "half_dtype" in state:
        _amp.set_half_dtype(state["half_dtype"])


def __getattr__(name):
    return getattr(_amp, name)
