"""``cstorch.optim.from_optax``: an optax ``GradientTransformation`` as a cstorch optimizer.

The transformation runs inside a traced step as one graph node (``cstorch::optax_update``),
so the whole step, optax update included, is one compiled program; outside a traced step
(or on the eager engine) the same update runs eagerly. The optax state lives in
``optimizer.state`` like any optimizer state: leaves that belong to one parameter (``mu``,
``nu``, ... of that parameter) are stored with it under the leaf's optax path (``"optax[0].mu"``),
the others (step counts, ...) with the first parameter. So ``state_dict()``, checkpoints and
the device-resident state work as for the built-in optimizers.

The learning rate and any schedule are the transformation's own (``optax.adamw(schedule)``);
cstorch schedulers, which write param-group values, do not apply. A parameter without a
gradient in a step gets a zero gradient (optax updates the whole parameter tree at once).
"""

from __future__ import annotations

import jax
import torch

from cstorch.optim.optimizer import Optimizer
from jax_backend import optax_ops
from jax_backend.dtypes import array_to_tensor, tensor_to_array
from jax_backend.errors import CstorchTypeError, CstorchValueError
from jax_backend.jax_settings import in_engine_scope


class OptaxOptimizer(Optimizer):
    """A cstorch optimizer whose update is ``transformation`` (see module docstring)."""

    def __init__(self, transformation, params):
        if not (
            callable(getattr(transformation, "init", None))
            and callable(getattr(transformation, "update", None))
        ):
            raise CstorchTypeError(
                f"from_optax expects an optax.GradientTransformation (with init and update), "
                f"got {type(transformation).__name__}."
            )
        params = list(params)
        if not params or not all(isinstance(p, torch.Tensor) for p in params):
            raise CstorchTypeError(
                "from_optax expects a non-empty iterable of parameters (e.g. "
                "model.parameters()); param groups do not apply: optax transforms the whole "
                "parameter list with its own hyperparameters."
            )
        self.transformation = transformation
        super().__init__(params, defaults={})

    @in_engine_scope  # the transformation's init makes arrays: in the engine's dtypes
    def preinitialize(self):
        params = self._params()
        opt_state = self.transformation.init([tensor_to_array(p) for p in params])
        leaves, treedef = jax.tree_util.tree_flatten_with_path(opt_state)
        self._key = optax_ops.register(self.transformation, treedef)
        self._slots = []  # (parameter, state key) of each optax leaf, in treedef order
        for path, leaf in leaves:
            leaf = jax.numpy.asarray(leaf)  # Python numbers in a state become arrays
            owner, key = params[0], "optax" + jax.tree_util.keystr(path)
            last = path[-1] if path else None
            if (
                isinstance(last, jax.tree_util.SequenceKey)
                and last.idx < len(params)
                and tuple(leaf.shape) == tuple(params[last.idx].shape)
            ):
                owner, key = params[last.idx], "optax" + jax.tree_util.keystr(path[:-1])
            if key in self.state[owner]:
                raise CstorchValueError(
                    f"optax state leaves collide at {key!r}; this transformation "
                    "cannot be stored per parameter."
                )
            self.state[owner][key] = array_to_tensor(leaf)
            self._slots.append((owner, key, self.state[owner][key].dtype))

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        # torch casts loaded state to its parameter's dtype; optax leaves keep their own
        # (e.g. an int32 step count).
        for owner, key, dtype in self._slots:
            value = self.state[owner].get(key)
            if value is None:
                raise KeyError(
                    f"The loaded state has no optax leaf {key!r} for a parameter "
                    f"of shape {tuple(owner.shape)}; it was saved by a different "
                    "optimizer or transformation."
                )
            if value.dtype != dtype:
                self.state[owner][key] = value.to(dtype)

    def _params(self):
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        loss = self._begin_step(closure)
        params = self._params()
        if all(p.grad is None for p in params):
            return loss
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        state = [self.state[owner][key] for owner, key, _ in self._slots]
        outputs = torch.ops.cstorch.optax_update(self._key, params, grads, state)
        for target, value in zip(params + state, outputs):
            target.copy_(value)
        return loss


def from_optax(transformation, params) -> OptaxOptimizer:
    """``transformation`` (e.g. ``optax.adamw(1e-3)``) as a cstorch optimizer of ``params``."""
    return OptaxOptimizer(transformation, params)
