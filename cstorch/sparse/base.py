"""``SparsityAlgorithm`` (the base of every algorithm) and ``SparseParameter`` (one mask).

A sparsified parameter ``<name>`` of a module gets a persistent bool buffer
``<name>_mask`` next to it (so masks live in ``model.state_dict()`` under the reference's
keys, are carried between compiled steps like any buffer, and are checkpointed). Around every
step, as in cerebras-pytorch 2.10:

* a forward pre-hook prunes the weights (``w *= mask``) and hooks their gradients, which are
  masked by selection (``where(mask, grad, 0)``) so NaNs of pruned positions vanish;
* an optimizer step pre-hook prunes the optimizer state tensors shaped like the parameter;
* an optimizer step post-hook prunes weights and state again, then calls ``update()``, where
  dynamic algorithms compute new masks in the traced step (see ``dynamic.py``).

Inside a traced step all of this is torch code captured into the one compiled program; masks
change there without recompiling. Masks are initialised eagerly before the first step (at the
start of a ``DataExecutor`` run, or just before a step is first compiled) from the current
parameter values, unless a checkpoint supplied them.

Parameters are found by identity (``id``), not through attributes set on them, because a
traced step sees the parameters' contents exchanged with tracer tensors.
"""

from __future__ import annotations

import warnings
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict, defaultdict
from contextlib import contextmanager
from functools import partial
from typing import Callable, Dict, Optional, Union

import torch
from torch.utils.hooks import RemovableHandle

from cstorch.backend import current_backend_impl
from cstorch.sparse.init import InitMethodType, make_init_method
from cstorch.sparse.utils import HyperParameterSchedule, make_hyperparam_schedule
from jax_backend.errors import CstorchRuntimeError, CstorchTypeError, CstorchValueError


class _ScheduleMap:
    """Parameter -> sparsity schedule (by identity), with a default schedule."""

    def __init__(self, default_factory: Callable, schedules: Optional[dict] = None):
        self._default_factory = default_factory
        self._schedules = {}  # id(param) -> (param, schedule); the param keeps its id valid
        for param, schedule in (schedules or {}).items():
            self[param] = schedule

    @property
    def default(self):
        return self._default_factory()

    def __getitem__(self, param):
        entry = self._schedules.get(id(param))
        return entry[1] if entry is not None else self._default_factory()

    def __setitem__(self, param, schedule):
        self._schedules[id(param)] = (param, schedule)

    def __contains__(self, param):
        return id(param) in self._schedules

    def items(self):
        return [(p, s) for p, s in self._schedules.values()]

    def values(self):
        return [s for _, s in self._schedules.values()]


class SparsityAlgorithm(ABC):
    """Base class of sparsity algorithms: owns the masks of the parameters it sparsified and
    the hooks that apply them (see module docstring).

    ``sparsity`` is a float, a schedule (see ``cstorch.sparse.utils``), or a dict mapping
    parameters to either; ``init_method`` is a name from ``cstorch.sparse.init`` or a function.
    Constructing one needs a backend.
    """

    _sparsity_algorithm_count = defaultdict(int)

    @classmethod
    def check_arguments(cls, **kwargs) -> None:
        """Raises ValueError for argument values the constructor would refuse, building
        nothing (``configure.check_config`` checks a config before a backend exists). The
        names are checked by the caller, against the constructors' signatures."""
        if kwargs.get("sparsity") is not None and not (
            isinstance(kwargs["sparsity"], dict)
            and any(isinstance(k, torch.Tensor) for k in kwargs["sparsity"])
        ):
            make_hyperparam_schedule(kwargs["sparsity"])
        if "init_method" in kwargs:
            make_init_method(kwargs["init_method"])

    def __init__(
        self,
        sparsity: Union[float, HyperParameterSchedule, None],
        init_method: InitMethodType = "random",
    ):
        count = SparsityAlgorithm._sparsity_algorithm_count[self.__class__]
        self.name = f"sparsity_{self.__class__.__name__.lower()}_{count}"
        SparsityAlgorithm._sparsity_algorithm_count[self.__class__] += 1

        self._backend = current_backend_impl()
        if sparsity is not None:
            self.sparsity = sparsity
        self.init_method = make_init_method(init_method)

        self.sparse_modules = weakref.WeakKeyDictionary()
        self.sparse_optimizers = weakref.WeakKeyDictionary()
        self.sparse_params: Dict[str, SparseParameter] = {}
        self._params_by_id: Dict[int, SparseParameter] = {}

        self.autoupdate = True
        self._target_sparsity_hooks = OrderedDict()
        self._computed_sparsity_hooks = OrderedDict()
        self._backend.setup_sparsity(self)

    # ----------------------------------------------------------------------- parameters
    @property
    def num_sparse_params(self) -> int:
        return len(self.sparse_params)

    def _sparse_param_of(self, tensor) -> Optional["SparseParameter"]:
        return self._params_by_id.get(id(tensor))

    def get_sparse_params(self, obj):
        """The sparse parameter of a tensor (or None), or an iterator over those of a module
        (recursively) or of an optimizer's param groups."""
        if isinstance(obj, torch.Tensor):
            return self._sparse_param_of(obj)
        if isinstance(obj, torch.nn.Module):
            params = (p for _, p in obj.named_parameters())
        elif isinstance(obj, torch.optim.Optimizer):
            params = (p for group in obj.param_groups for p in group["params"])
        else:
            raise CstorchTypeError(
                f"Expected torch.nn.Module or torch.optim.Optimizer, but got {type(obj)}"
            )
        return (sp for p in params if (sp := self._sparse_param_of(p)) is not None)

    def initialize(self) -> None:
        """Initialises every mask not yet initialised (nor loaded from a checkpoint)."""
        for sparse_param in self.sparse_params.values():
            sparse_param.initialize()

    def csx_annotate_sparsity(self, param: "SparseParameter") -> None:
        """Compiler hints on a Cerebras system; nothing to annotate here."""

    # ------------------------------------------------------------------------- sparsity
    @property
    def sparsity(self) -> _ScheduleMap:
        """Parameter -> sparsity schedule."""
        if not hasattr(self, "_sparsity"):

            def missing():
                raise CstorchValueError(
                    f"{self.__class__.__name__} sparsity algorithm expected `sparsity` to be "
                    "specified, but got none."
                )

            self._sparsity = _ScheduleMap(missing)
        return self._sparsity

    @sparsity.setter
    def sparsity(self, sparsity) -> None:
        if isinstance(sparsity, dict) and any(isinstance(k, torch.Tensor) for k in sparsity):

            def missing():
                raise KeyError("No sparsity schedule found for parameter")

            self._sparsity = _ScheduleMap(
                missing, {p: make_hyperparam_schedule(s) for p, s in sparsity.items()}
            )
        else:
            default = make_hyperparam_schedule(sparsity)
            previous = getattr(self, "_sparsity", None)
            self._sparsity = _ScheduleMap(lambda: default)
            for param, schedule in previous.items() if previous is not None else ():
                self._sparsity[param] = schedule

    # ------------------------------------------------------------------------- applying
    def apply(self, obj) -> None:
        """Sparsifies a ``torch.nn.Module`` or a ``cstorch.optim.Optimizer`` (also reached as
        ``model.apply(sparsity)`` / ``optimizer.apply(sparsity)``)."""
        from cstorch.optim import Optimizer

        if isinstance(obj, torch.nn.Module):
            self.sparsify_module(obj)
        elif isinstance(obj, Optimizer):
            self.sparsify_optimizer(obj)
        else:
            raise CstorchTypeError(
                f"Expected torch.nn.Module or cstorch.optim.Optimizer, but got {type(obj)}"
            )

    def sparsify_parameter(
        self, module: torch.nn.Module, name: str, param: Optional[torch.Tensor]
    ) -> None:
        """Creates the mask of ``param`` (named ``name``), owned by ``module``."""
        if param is None or self.get_sparse_params(param) is not None:
            return
        if getattr(param, "requires_dense", False):
            return
        sparsity = self.sparsity[param](getattr(self, "step", 0))
        sparsity = torch.clamp(torch.as_tensor(sparsity, dtype=torch.float32), 0.0, 1.0)
        sparse_param = SparseParameter(module, name, partial(self.init_method, sparsity=sparsity))
        param._sparse_param = sparse_param
        self.sparse_params[name] = sparse_param
        self._params_by_id[id(param)] = sparse_param

    def sparsify_module(self, module: torch.nn.Module) -> None:
        before = self.num_sparse_params
        for prefix, submodule in module.named_modules():
            if getattr(submodule, "requires_dense", False):
                continue
            if submodule in self.sparse_modules or getattr(submodule, "is_sparse", False):
                warnings.warn(f"Module {submodule} has already been sparsified.")
                continue
            self.sparse_modules[submodule] = True
            submodule.is_sparse = True
            for key, param in list(submodule._parameters.items()):
                name = f"{prefix}.{key}" if prefix else key
                self.sparsify_parameter(submodule, name, param)
        if self.num_sparse_params == before:
            warnings.warn(f"No parameters were sparsified in module {module}")
            return
        module.register_forward_pre_hook(self._forward_pre_hook)

    def _forward_pre_hook(self, module: torch.nn.Module, args) -> None:
        if not self._backend.is_tracing:
            # An eager forward works on the torch tensors: bring them up to date first.
            self.initialize()
            self._backend.materialize_state()
        for sparse_param in self.get_sparse_params(module):
            sparse_param.clear()
            self.prune_weight(sparse_param)

    @torch.no_grad()
    def prune_weight(self, sparse_param: "SparseParameter") -> None:
        """Prunes the weight and hooks its gradient (once per forward)."""
        p = sparse_param.param
        sparse_param.prune(p, sparse_param.name)
        if sparse_param.grad_hook is not None:
            sparse_param.grad_hook.remove()
            sparse_param.grad_hook = None
        if p.requires_grad:
            sparse_param.grad_hook = p.register_hook(partial(self._grad_hook, sparse_param))

    def _grad_hook(self, sparse_param: "SparseParameter", grad: torch.Tensor) -> torch.Tensor:
        # A selection, not a product: NaNs in pruned positions must not poison the update.
        return torch.where(sparse_param.mask, grad, torch.zeros_like(grad))

    def sparsify_optimizer(self, optimizer) -> None:
        if optimizer in self.sparse_optimizers or getattr(optimizer, "is_sparse", False):
            return
        self.sparse_optimizers[optimizer] = True
        optimizer.is_sparse = True
        if len(self.sparse_optimizers) > 1:
            raise CstorchRuntimeError(
                "Sparsifying multiple optimizers using the same sparsity algorithm is not "
                "supported."
            )

        def prune_optimizer_states(optimizer, args, kwargs):
            params = list(self.get_sparse_params(optimizer))
            if not params:
                raise CstorchRuntimeError(
                    "Detected that optimizer.apply(sparsity) was called but "
                    "model.apply(sparsity) was not.\nPlease call model.apply(sparsity)."
                )
            for sparse_param in params:
                p = sparse_param.param
                for name, state in optimizer.state[p].items():
                    if (
                        isinstance(state, torch.Tensor)
                        and state.shape == p.shape
                        and not getattr(state, "requires_dense", False)
                    ):
                        sparse_param.prune(state, name)

        def step_post_hook(optimizer, args, kwargs):
            # Re-prune with the current masks, then let the algorithm update them.
            for sparse_param in self.get_sparse_params(optimizer):
                sparse_param.prune()
            if self.autoupdate:
                self.update(optimizer)

        optimizer.register_step_pre_hook(prune_optimizer_states)
        optimizer.register_step_post_hook(step_post_hook)

    @abstractmethod
    def update(self, optimizer=None) -> None:
        """Updates the masks after an optimizer step."""

    # ---------------------------------------------------------------------------- hooks
    def register_target_sparsity_hook(self, hook) -> RemovableHandle:
        """``hook(algorithm, name_glob, target)`` runs when a target sparsity is computed."""
        handle = RemovableHandle(self._target_sparsity_hooks)
        self._target_sparsity_hooks[handle.id] = hook
        return handle

    def register_computed_sparsity_hook(self, hook) -> RemovableHandle:
        """``hook(algorithm, name, computed)`` runs when a new mask is computed."""
        handle = RemovableHandle(self._computed_sparsity_hooks)
        self._computed_sparsity_hooks[handle.id] = hook
        return handle

    # ---------------------------------------------------------------------------- state
    def visit_state(self, f: Callable) -> None:
        """Applies ``f`` to the algorithm's state tensors."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads what ``state_dict()`` returned."""

    def _cstorch_state_slots(self) -> list:
        """State tensors carried between compiled steps (none for static algorithms)."""
        return []


class SparseParameter:
    """One sparsified parameter: its module, name and mask buffer (``<name>_mask``).

    It owns neither the parameter nor the mask; it registers the mask with the module and
    remembers which tensors (weight, optimizer state) were pruned with it this step."""

    DISABLE_MASK_ACCESS_WARNING = False

    @staticmethod
    @contextmanager
    def disable_mask_access_warning():
        previous = SparseParameter.DISABLE_MASK_ACCESS_WARNING
        SparseParameter.DISABLE_MASK_ACCESS_WARNING = True
        try:
            yield
        finally:
            SparseParameter.DISABLE_MASK_ACCESS_WARNING = previous

    def __init__(self, module: torch.nn.Module, name: str, init_method: Callable):
        self._module_ref = weakref.ref(module)
        self.name = name
        self.param_name = name.rsplit(".", 1)[-1]
        self.mask_name = f"{self.param_name}_mask"
        self.init_method = init_method
        self._backend = current_backend_impl()
        module.register_buffer(
            self.mask_name, torch.ones(tuple(self.param.shape), dtype=torch.bool), persistent=True
        )
        self._initialized = False
        self.grad_hook = None
        self._pruned_tensors: list = []  # (tensor, name) pruned with this mask this step
        self._annotations: dict = {}

        def loading(state_dict, prefix, *args, **kwargs):
            if f"{prefix}{self.mask_name}" in state_dict:
                self._initialized = True  # the checkpoint supplies the mask

        module._register_load_state_dict_pre_hook(loading)
        _install_mask_property(type(self.param))

    @property
    def module(self) -> torch.nn.Module:
        module = self._module_ref()
        if module is None:
            raise CstorchValueError("Attempting to access mask after module deleted")
        return module

    @property
    def param(self) -> torch.Tensor:
        return self.module._parameters[self.param_name]

    @property
    def data(self) -> torch.Tensor:
        return self.param

    @property
    def mask(self) -> torch.Tensor:
        return self.module._buffers[self.mask_name]

    @mask.setter
    def mask(self, new_mask) -> None:
        self.update(new_mask)

    def initialize(self) -> None:
        """Computes the initial mask from the parameter's current value (once)."""
        if self._initialized or self._module_ref() is None:  # done, or the model is gone
            return
        self._backend.materialize_state()
        with torch.no_grad():
            mask = self.init_method(self.param.detach())
        if not isinstance(mask, torch.Tensor):
            raise CstorchTypeError(f"Expected init_method to return a Tensor, but got {type(mask)}")
        if tuple(mask.shape) != tuple(self.param.shape):
            raise CstorchValueError(
                f"The init_method returned a mask of shape {tuple(mask.shape)} for parameter "
                f"{self.name} of shape {tuple(self.param.shape)}."
            )
        # In place: a step about to be compiled already holds this buffer as its state.
        with torch.no_grad():
            self.mask.copy_(mask.to(torch.bool))
        self._initialized = True

    def annotate(self, name, value) -> None:
        if self._pruned_tensors:
            raise CstorchRuntimeError(
                "Detected that annotations are being set after pruning tensors: "
                f"{sorted(n for _, n in self._pruned_tensors)}"
            )
        self._annotations[name] = value

    @torch.no_grad()
    def prune(self, tensor: Optional[torch.Tensor] = None, tensor_name=None) -> None:
        """Zeroes ``tensor``'s pruned positions in place (and remembers it); without a tensor,
        re-prunes every tensor pruned with this mask this step."""
        if tensor is None:
            for remembered, name in list(self._pruned_tensors):
                self.prune(remembered, name)
            return
        tensor.mul_(self.mask)
        if not any(t is tensor for t, _ in self._pruned_tensors):
            self._pruned_tensors.append((tensor, tensor_name))

    def update(self, new_mask) -> None:
        """Writes a new mask and re-prunes every tensor pruned with the old one."""
        if not self._initialized:
            raise CstorchRuntimeError(
                "Detected that mask is being updated before it was initialized"
            )
        if not self._pruned_tensors:
            raise CstorchRuntimeError("Detected that mask is being updated before it was used")
        with torch.no_grad():
            self.mask.copy_(new_mask)
        self.prune()

    def clear(self) -> None:
        """Forgets this step's pruned tensors and annotations."""
        self._pruned_tensors.clear()
        self._annotations.clear()

    def __str__(self):
        return f"SparseParameter({self.name})"


def _install_mask_property(cls) -> None:
    """``param.mask``: the mask of a sparsified parameter (None for others), up to date."""
    if isinstance(getattr(cls, "mask", None), property):
        return

    def mask(p):
        sparse_param = getattr(p, "_sparse_param", None)
        if sparse_param is None:
            return None
        if not SparseParameter.DISABLE_MASK_ACCESS_WARNING:
            warnings.warn(
                "Using the mask tensor haphazardly can lead to compile failures and/or be very "
                "computationally expensive. Please only use the mask tensor directly if you "
                "really know what you are doing."
            )
        if not sparse_param._backend.is_tracing:
            sparse_param._backend.materialize_state()
        return sparse_param.mask

    cls.mask = property(mask)
