"""``cstorch.optim.Optimizer``: the torch.optim contract plus the Cerebras rules.

All state is created up front in ``preinitialize()`` (so the whole step, optimizer included,
can be compiled before the first step) and ``step()`` only updates existing state.

Built-in optimizers (``BuiltinOptimizer`` subclasses) hold hyperparameters only: their
``step()`` emits one ``cstorch::optimizer_update`` op per param group (``optimizer_step``
written in place), whose meaning is the pure JAX update rule in ``jax_backend.optimizers``.
User subclasses write ``step()`` in torch ops and are captured like any other torch code.

Differences from cerebras-pytorch 2.10 (on purpose):

* ``register_zero_grad_post_hook`` hooks run *after* the grads are zeroed (the reference put
  them among the pre hooks).
* ``load_state_dict`` copies every incoming tensor into a plain tensor, so the loaded state
  never aliases the tensors of the given dict (torch keeps ``step`` tensors shared) and
  lazily loaded checkpoint tensors become ordinary state.
"""

import functools
import warnings
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any, Dict

import torch
from torch.optim.optimizer import ParamsT  # the params type hint, as in the reference
from torch.utils.hooks import RemovableHandle

from cstorch.backend import current_backend_impl
from jax_backend.errors import CstorchRuntimeError, CstorchTypeError, CstorchValueError
from jax_backend.torch_ops import init_optimizer_state, optimizer_config, optimizer_state_layout


class Optimizer(torch.optim.Optimizer, ABC):
    """Base class of cstorch optimizers (see module docstring).

    Construction: torch's ``Optimizer.__init__``; then, on the backend's device,
    ``preinitialize()`` and (with ``enable_global_step``) a float32 ``step`` tensor of 0 for
    every parameter, inserted after the preinitialized keys; then the optimizer registers with
    the backend, and each group's ``tags`` becomes a set. Creating one without a backend raises
    ``RuntimeError``.
    """

    def __init__(self, params: ParamsT, defaults: Dict[str, Any], enable_global_step: bool = False):
        super().__init__(params, defaults)
        self.enable_global_step = enable_global_step
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

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("preinitialize")
        if own is not None and not getattr(own, "__isabstractmethod__", False):
            cls.preinitialize = _keeping_existing_state(own)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        _normalize_tags(self.param_groups[-1])
        if "_schedulers_registry" in self.__dict__:  # a group added after construction
            self._initialize_new_state()

    def _initialize_new_state(self):
        """Creates the state of parameters that have none, keeping every existing tensor
        (the moments of a running optimizer must survive a new param group)."""
        self.backend.materialize_state()
        existing = {p: dict(state) for p, state in self.state.items() if state}
        with self.backend.device:
            self.preinitialize()
            for group in self.param_groups:
                for p in group["params"]:
                    if self.enable_global_step and p not in existing:
                        self.state[p]["step"] = torch.tensor(0.0, dtype=torch.float32)
        for p, state in existing.items():
            self.state[p] = state
        self.backend.invalidate_state_view()

    @abstractmethod
    def preinitialize(self):
        """Creates every state tensor the optimizer will use."""

    @abstractmethod
    def step(self, closure=None):
        """Updates parameters and existing state; never creates state."""

    def _finite_increment(self):
        """How far counters tied to this optimizer (schedulers' ``last_epoch``) advance this
        step: 1, or, while a dynamic GradScaler checked this step's gradients, the int64
        0-dim tensor "they were finite", so a skipped update is not counted. The scaler
        publishes that flag on the optimizer it steps (``_amp_stash.isfinite``); schedulers
        read it here and need not know about loss scaling."""
        value = getattr(getattr(self, "_amp_stash", None), "isfinite", None)
        return value.long() if isinstance(value, torch.Tensor) else 1

    def increment_global_step(self, p):
        """Adds 1 to ``state[p]["step"]`` in place and returns that float32 tensor."""
        state = self.state[p]
        if "step" not in state:
            raise CstorchRuntimeError(
                f"{type(self).__name__} has no global step in the state of this parameter; "
                "construct the optimizer with enable_global_step=True to create it."
            )
        state["step"].add_(1.0)
        return state["step"]

    def state_dict(self, *args, **kwargs):
        self.backend.materialize_state()
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        state_dict["state"] = {k: plain_copies(v) for k, v in state_dict["state"].items()}
        state_dict["param_groups"] = [plain_copies(g) for g in state_dict["param_groups"]]
        self._check_state_shapes(state_dict)
        with self.backend.device:
            super().load_state_dict(state_dict)
        for group in self.param_groups:
            _normalize_tags(group)
        self._scheduled_values_as_tensors()

    def _check_state_shapes(self, state_dict) -> None:
        """A state_dict of another model with as many parameters per group passes torch's
        checks, and its state would meet this model's parameters only inside the first step.
        Each state tensor must have the shape of the one it replaces (all state exists from
        the start here); ValueError naming both shapes otherwise, before anything changes.
        (Different group sizes are left to torch's own error.)"""
        saved_groups = state_dict.get("param_groups", [])
        if len(saved_groups) != len(self.param_groups) or any(
            len(saved["params"]) != len(group["params"])
            for saved, group in zip(saved_groups, self.param_groups)
        ):
            return
        mismatches = []
        for group_index, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            for index, (key, param) in enumerate(zip(saved["params"], group["params"])):
                incoming, own = state_dict["state"].get(key, {}), self.state.get(param, {})
                for name, value in incoming.items():
                    current = own.get(name)
                    if (
                        isinstance(value, torch.Tensor)
                        and isinstance(current, torch.Tensor)
                        and value.shape != current.shape
                    ):
                        mismatches.append(
                            f"parameter {index} of param group {group_index} (shape "
                            f"{_shape(param.shape)}): {name!r} is {_shape(value.shape)} in the "
                            f"state_dict, {_shape(current.shape)} here"
                        )
        if mismatches:
            shown = "; ".join(mismatches[:3]) + ("; ..." if len(mismatches) > 3 else "")
            raise CstorchValueError(
                f"Cannot load this {type(self).__name__} state: it is from a model with other "
                f"parameter shapes ({len(mismatches)} state tensor(s) differ: {shown}). Load "
                "the optimizer state saved together with this model's weights. Nothing was "
                "changed."
            )

    def _scheduled_values_as_tensors(self):
        """Keeps every scheduled group value a float32 0-dim tensor (state a traced step can
        update) when a loaded state_dict holds a plain number there, e.g. one saved by a
        torch optimizer; the value itself is kept."""
        for scheduler in list(self._schedulers_registry):
            key = scheduler.param_group_key
            for group in self.param_groups:
                value = group.get(key)
                if (
                    scheduler._should_apply_to_param_group(group)
                    and value is not None
                    and not isinstance(value, torch.Tensor)
                ):
                    group[key] = torch.tensor(float(value), dtype=torch.float32)

    # ----------------------------------------------------------------------- zero_grad hooks
    def register_zero_grad_pre_hook(self, hook) -> RemovableHandle:
        """Registers ``hook(optimizer, args, kwargs)`` to run before ``zero_grad``; it may
        return ``(new_args, new_kwargs)``."""
        handle = RemovableHandle(self._zero_grad_pre_hooks)
        self._zero_grad_pre_hooks[handle.id] = hook
        return handle

    def register_zero_grad_post_hook(self, hook) -> RemovableHandle:
        """Registers ``hook(optimizer, args, kwargs)`` to run after the grads are zeroed.

        Differs from cerebras-pytorch 2.10, whose registrar put post hooks among the pre hooks
        so they ran before zeroing."""
        handle = RemovableHandle(self._zero_grad_post_hooks)
        self._zero_grad_post_hooks[handle.id] = hook
        return handle

    def zero_grad(self, *args, **kwargs):
        for hook in list(self._zero_grad_pre_hooks.values()):
            result = hook(self, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise CstorchRuntimeError(
                        f"The zero_grad pre hook {hook!r} must return None or a tuple "
                        f"(new_args, new_kwargs), but returned {result!r}."
                    )
                args, kwargs = result
        set_to_none = kwargs.get("set_to_none", args[0] if args else True)
        self.backend.gradients_reset(
            [p for group in self.param_groups for p in group["params"]], set_to_none
        )
        if not set_to_none:
            warnings.warn(
                "zero_grad(set_to_none=False) keeps zero-filled gradient tensors alive; prefer "
                "the default set_to_none=True.",
                stacklevel=2,
            )
        super().zero_grad(*args, **kwargs)
        for hook in list(self._zero_grad_post_hooks.values()):
            hook(self, args, kwargs)

    # ------------------------------------------------------------------------------- visitors
    def apply(self, f):
        """``f(self)``, or ``f.apply(self)`` for an object with an ``apply`` method."""
        if callable(f):
            return f(self)
        method = getattr(f, "apply", None)
        if callable(method):
            return method(self)
        raise CstorchTypeError(
            f"Optimizer.apply expects a callable or an object with an `apply` method, got "
            f"{type(f).__name__}."
        )

    def visit_state(self, fn):
        """Replaces each state value ``v`` by ``fn(v)`` where that is not None."""
        for state in self.state.values():
            for key, value in list(state.items()):
                new = fn(value)
                if new is not None:
                    state[key] = new

    def _begin_step(self, closure):
        """What every ``step`` does first: evaluate ``closure`` (with grad) and, outside a
        trace, bring the newest state back so an eager step starts from it. Returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self.backend.is_tracing:
            self.backend.materialize_state()  # an eager step must start from the newest state
        return loss


def _keeping_existing_state(preinitialize):
    """``preinitialize`` that only adds state: called on a running optimizer (after
    ``add_param_group``, as the reference expects), it creates the new parameters' state and
    keeps every existing tensor, so moments survive as they do in eager torch."""

    @functools.wraps(preinitialize)
    def keeping(self):
        existing = {p: dict(state) for p, state in self.state.items() if state}
        preinitialize(self)
        if not existing:
            return
        for p, state in existing.items():
            self.state[p].update(state)  # the old tensors back, in the keys' order
        if "_schedulers_registry" in self.__dict__:  # a registered optimizer: new state
            self.backend.invalidate_state_view()

    return keeping


def _normalize_tags(group):
    tags = group.get("tags")
    if not tags or isinstance(tags, set):
        return
    group["tags"] = set(tags) if isinstance(tags, (list, tuple)) else {tags}


def _shape(size) -> str:
    return str(tuple(size))


def plain_copies(value):
    """``value`` with every tensor (a lazily loaded checkpoint tensor, another object's state)
    replaced by a plain, unshared copy, at any depth of dicts, lists and tuples, which are
    rebuilt (so the caller's containers are not shared either); other values are kept. What
    ``load_state_dict`` of the optimizers and schedulers keeps of the dict it is given."""
    if isinstance(value, torch.Tensor):
        copy = torch.empty(tuple(value.shape), dtype=value.dtype)
        with torch.no_grad():
            copy.copy_(value)
        return copy
    if isinstance(value, dict):
        return {k: plain_copies(v) for k, v in value.items()}
    if isinstance(value, list) or type(value) is tuple:
        return type(value)(plain_copies(v) for v in value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(plain_copies(v) for v in value))
    return value


class BuiltinOptimizer(Optimizer):
    """An optimizer whose update rule is ``jax_backend.optimizers.OPTIMIZERS[rule]``.

    Subclasses set ``rule``, ``hyperparameters`` (param-group key -> the rule's argument
    name) and ``global_step`` (whether the reference builds them with
    ``enable_global_step=True``; the rule then keeps ``step`` as its last state field).
    Group values that are tensors (e.g. a scheduled ``lr``) enter the step as tensors; the
    others are constants of the compiled step. The state a parameter holds is the rule's
    ``init`` state, keyed by the rule's field names, in field order.
    """

    rule: str = ""
    hyperparameters: dict = {}
    global_step: bool = False

    def __init__(self, params, defaults):
        super().__init__(params, defaults, enable_global_step=self.global_step)

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
                    if tensor is not None:
                        self.state[p][key] = tensor

    def _check_group(self, group, params):
        """Raises for a param group the rule cannot update (subclass hook)."""

    def _state_leaves(self, params, config):
        layout = optimizer_state_layout(config, params)
        leaves = []
        for field in layout.fields:
            for index, (p, keys) in enumerate(zip(params, layout.keys_per_param)):
                if field not in keys:
                    continue
                state = self.state[p]
                if field not in state:
                    raise CstorchRuntimeError(
                        f"{type(self).__name__}: the state of parameter {index} (shape "
                        f"{tuple(p.shape)}) has no {field!r} entry (it has {sorted(state)}), "
                        f"but its update needs {list(keys)}. Optimizer state must come from "
                        "preinitialize() or from a state_dict saved with the same "
                        "hyperparameters."
                    )
                leaves.append(state[field])
        return leaves

    @torch.no_grad()
    def step(self, closure=None):
        loss = self._begin_step(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if p.grad.is_sparse:
                    raise CstorchRuntimeError(
                        f"{type(self).__name__} does not support sparse gradients."
                    )
            self._check_group(group, params)
            static, dynamic = self._rule_arguments(group)
            config = optimizer_config(self.rule, static, list(dynamic))
            state = self._state_leaves(params, config)
            torch.ops.cstorch.optimizer_update(
                config, params, [p.grad for p in params], state, list(dynamic.values())
            )
        return loss
