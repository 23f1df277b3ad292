"""``cstorch.optim.Optimizer``: the torch.optim contract plus the Cerebras rules.

All state is created up front in ``preinitialize()`` (so the whole step, optimizer included,
can be compiled before the first step) and ``step()`` only updates existing state.

Built-in optimizers (``BuiltinOptimizer`` subclasses) hold hyperparameters only: their
``step()`` emits one ``cstorch::optimizer_step`` op per param group, whose meaning is the pure
JAX update rule in ``jax_backend.optimizers``. User subclasses write ``step()`` in torch ops
and are captured like any other torch code.
"""

from __future__ import annotations

import warnings
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict

import torch
from torch.utils.hooks import RemovableHandle

from jax_backend.torch_ops import init_optimizer_state, optimizer_spec, optimizer_state_keys
from cstorch.backend import current_backend_impl


class Optimizer(torch.optim.Optimizer, ABC):
    """Base class of cstorch optimizers (see module docstring)."""

    def __init__(self, params, defaults, enable_global_step: bool = False):
        super().__init__(params, defaults)
        self.backend = current_backend_impl()
        with self.backend.device:
            self.preinitialize()
            if enable_global_step:
                for group in self.param_groups:
                    for p in group["params"]:
                        self.state[p]["step"] = torch.tensor(0.0, dtype=torch.float32)
        self._schedulers_registry = weakref.WeakKeyDictionary()
        self._zero_grad_pre_hooks = OrderedDict()
        self._zero_grad_post_hooks = OrderedDict()
        self.backend.register_optimizer(self)
        for group in self.param_groups:
            _normalize_tags(group)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        _normalize_tags(self.param_groups[-1])

    @abstractmethod
    def preinitialize(self):
        """Creates every state tensor the optimizer will use."""

    @abstractmethod
    def step(self, closure=None):
        """Updates parameters and existing state; never creates state."""

    def increment_global_step(self, p):
        state = self.state[p]
        if "step" not in state:
            raise RuntimeError(
                "increment_global_step needs a 'step' state entry; construct the optimizer "
                "with enable_global_step=True.")
        state["step"].add_(1.0)
        return state["step"]

    def state_dict(self, *args, **kwargs):
        self.backend.materialize_state()
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict):
        with self.backend.device:
            super().load_state_dict(state_dict)
        for group in self.param_groups:
            _normalize_tags(group)

    # ----------------------------------------------------------------------- zero_grad hooks
    def register_zero_grad_pre_hook(self, hook) -> RemovableHandle:
        handle = RemovableHandle(self._zero_grad_pre_hooks)
        self._zero_grad_pre_hooks[handle.id] = hook
        return handle

    def register_zero_grad_post_hook(self, hook) -> RemovableHandle:
        """Registers ``hook(optimizer, args, kwargs)`` to run after the grads are zeroed.

        Differs from cerebras-pytorch 2.10, whose registrar put post hooks among the pre hooks
        so they ran before zeroing (spec §17)."""
        handle = RemovableHandle(self._zero_grad_post_hooks)
        self._zero_grad_post_hooks[handle.id] = hook
        return handle

    def zero_grad(self, *args, **kwargs):
        for hook in list(self._zero_grad_pre_hooks.values()):
            result = hook(self, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError(
                        "A zero_grad pre hook must return None or a tuple (args, kwargs), got "
                        f"{result!r}.")
                args, kwargs = result
        set_to_none = kwargs.get("set_to_none", args[0] if args else True)
        if not set_to_none:
            warnings.warn(
                "zero_grad(set_to_none=False) keeps zero-filled gradient tensors alive; prefer "
                "the default set_to_none=True.", stacklevel=2)
        super().zero_grad(*args, **kwargs)
        for hook in list(self._zero_grad_post_hooks.values()):
            hook(self, args, kwargs)

    # ------------------------------------------------------------------------------- visitors
    def apply(self, f):
        if callable(f):
            return f(self)
        if hasattr(f, "apply"):
            return f.apply(self)
        raise TypeError(f"Expected a callable or an object with `apply`, got {type(f).__name__}.")

    def visit_state(self, fn):
        for state in self.state.values():
            for key, value in list(state.items()):
                new = fn(value)
                if new is not None:
                    state[key] = new


def _normalize_tags(group):
    tags = group.get("tags")
    if tags is None:
        return
    group["tags"] = set(tags) if isinstance(tags, (list, tuple, set)) else {tags}


class BuiltinOptimizer(Optimizer):
    """An optimizer whose update rule is ``jax_backend.optimizers.OPTIMIZERS[rule]``.

    ``hyperparameters`` maps param-group keys to the rule's argument names. Group values that
    are tensors (e.g. a scheduled ``lr``) enter the step as tensors; the others are constants.
    """

    rule: str = ""
    hyperparameters: dict = {}

    def _rule_arguments(self, group):
        static, dynamic = {}, {}
        for key, name in self.hyperparameters.items():
            value = group[key]
            if isinstance(value, torch.Tensor):
                dynamic[name] = value
            else:
                static[name] = list(value) if isinstance(value, tuple) else value
        return static, dynamic

    def preinitialize(self):
        for group in self.param_groups:
            static, dynamic = self._rule_arguments(group)
            hyper = dict(static, **{k: float(v) for k, v in dynamic.items()})
            initial = init_optimizer_state(self.rule, hyper, group["params"])
            for key, tensors in initial.items():
                for p, tensor in zip(group["params"], tensors):
                    self.state[p][key] = tensor

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients.")
            static, dynamic = self._rule_arguments(group)
            keys = optimizer_state_keys(self.rule, static, dynamic)
            state = [self.state[p][k] for k in keys for p in params]
            spec = optimizer_spec(self.rule, static, list(dynamic))
            outputs = torch.ops.cstorch.optimizer_step(
                spec, params, [p.grad for p in params], state, list(dynamic.values()))
            for target, value in zip(params + state, outputs):
                target.copy_(value)
        return loss
