"""What of the registered models selects a compiled program besides the step's inputs.

A step traced in one combination of train/eval modes, hooks, ``requires_grad`` flags and
held gradients is only valid in that combination (``cstorch.core.programs.ProgramSignature``
reads it here). The gradient bookkeeping between steps lives here too: ``zero_grad`` calls
are counted (a step that leaves its gradients un-zeroed is told apart from one zeroed between
calls), and the parameters whose ``.grad`` eager torch would hold between steps are known.
"""

from __future__ import annotations

import torch
from torch.nn.modules import module as _torch_module


class ModesAndHooks:
    """Modes, hooks and gradient bookkeeping of the models in ``registry``."""

    def __init__(self, registry, trace):
        self._registry = registry
        self._trace = trace  # zero_grad while a step is traced changes nothing held
        self._resets = 0
        # ids of the parameters whose .grad eager torch would hold (a tensor, not None)
        # between steps: a compiled step's gradients are not kept, but a parameter that has
        # one starts the next step with a zero gradient, so that a parameter frozen after
        # zero_grad(set_to_none=False) is still stepped (momentum, weight decay), as in eager.
        self._held: frozenset = frozenset()

    @property
    def mode(self) -> str:
        """ "eval" once every registered model is in eval mode, else "train"."""
        models = self._registry.models
        if models and not any(model.training for model in models):
            return "eval"
        return "train"

    def module_modes_and_hooks(self) -> tuple:
        """``(modes, hooks)`` in one walk over the modules: the ``training`` flag of each
        module of each registered model (a step traced with dropout on or batch-norm
        statistics updated is only valid so) and ``hooks``, which names every forward and
        backward hook of every registered module, and torch's global module hooks, by handle
        id (ids are never reused): a hook registered or removed between steps changes what
        eager torch computes, so it selects another program. Each entry is positions (atoms)
        then tuples of handle ids (``programs.persistent_signature`` ranks the ids)."""
        modes, hooks = [], []
        for m, model in enumerate(self._registry.models):
            flags = []
            # Depth first over ``_modules`` (a shared submodule is visited once per place it
            # is used): cheaper than ``modules()``, which builds every name.
            stack = [model]
            while stack:
                module = stack.pop()
                flags.append(module.training)
                if (
                    module._forward_hooks
                    or module._forward_pre_hooks
                    or module._backward_hooks
                    or module._backward_pre_hooks
                ):
                    hooks.append(
                        (
                            m,
                            len(flags),
                            tuple(module._forward_pre_hooks),
                            tuple(module._forward_hooks),
                            tuple(module._backward_pre_hooks),
                            tuple(module._backward_hooks),
                        )
                    )
                children = module._modules
                if children:
                    stack.extend(child for child in children.values() if child is not None)
            modes.append(tuple(flags))
        hooks.extend(
            ("torch global", k, tuple(table))
            for k, table in enumerate(_global_module_hooks())
            if table
        )
        return tuple(modes), tuple(hooks)

    def parameter_autograd(self, view) -> tuple:
        """``(requires_grad of each model parameter, hooks on them, whether it is frozen and
        holds a gradient)``: freezing a layer, registering a tensor hook or setting a frozen
        layer's gradients to None between steps changes what eager torch computes, so it
        selects another program. (Whether a trainable parameter starts with a zero gradient
        or none changes nothing: backward gives it one.) Read without the state guard (no
        value is touched)."""
        hooks = []
        held = self._held
        with torch._C.DisableTorchFunctionSubclass():
            flags = tuple(p.requires_grad for p in view.parameters)
            holding = tuple(
                not p.requires_grad and (id(p) in held or p.grad is not None)
                for p in view.parameters
            )
            for i, p in enumerate(view.parameters):
                before, after = p._backward_hooks, p._post_accumulate_grad_hooks
                if before or after:
                    hooks.append((i, tuple(before or ()), tuple(after or ())))
        return flags, tuple(hooks), holding

    # ------------------------------------------------------------------ gradients
    @property
    def gradient_resets(self) -> int:
        """How many ``zero_grad`` calls of any optimizer or compiled module there were."""
        return self._resets

    def gradients_reset(self, parameters, set_to_none: bool) -> None:
        """A ``zero_grad`` of an optimizer or compiled module over ``parameters``: counted;
        between steps with ``set_to_none``, those parameters hold no gradient any more."""
        self._resets += 1
        if set_to_none and not self._trace.is_tracing and self._held:
            self._held = self._held - {id(p) for p in parameters}

    def step_held_gradients(self, parameters) -> None:
        """After a compiled step: ``parameters`` hold a gradient, no others."""
        self._held = frozenset(id(p) for p in parameters)


def _global_module_hooks() -> tuple:
    """torch's hook tables that apply to every module (``register_module_forward_hook``
    and its relatives)."""
    return tuple(
        getattr(_torch_module, name, None) or {}
        for name in (
            "_global_forward_pre_hooks",
            "_global_forward_hooks",
            "_global_backward_pre_hooks",
            "_global_backward_hooks",
        )
    )
