"""The engine's fused CPU optimizer updates: the built-in Adam family's (``optimizers.adam_base``:
Adam, AdamW) and SGD's update of a whole param group as one JAX FFI custom call
(``native/fused_optimizer.cc``), each parameter's value and state read once and written in
place (``cpu_optimizer="native"``, the default).

Why: XLA's CPU compiler fuses no kernel with several results, so Adam's three new arrays per
parameter are three kernels (SGD with momentum's two), each reading the gradient again, and
Adam's bias-correction powers two or three tiny kernels per parameter; each distinct kernel is
compiled on the step's first run (~13 ms of CPU each). On ``bench_engine``'s transformer
that was 26 of ~80 distinct kernels: its first step went from 2.23 to 1.95 s
(``benchmarks/cpu_results.md``, ninth session); the steady step is unchanged.

The numbers: the rule's own operations in float32, in its order, each rounded on its own
(the library is built with ``-ffp-contract=off``); the hyperparameters are float32 operands
computed here as the JAX rules compute them (a Python float's ``1 - β`` in double, then
rounded; a traced one's in float32). XLA may fuse a multiply and an add into one rounding
where this does not, so the two differ in some elements by a few units of rounding
(``tests/jax_backend/test_native_optimizer.py`` bounds it).

Where: only in the engine's own program for one CPU device (``Target.native_optimizer``,
which ``Program`` sets), for float32 parameters and state; an export, ``pure_function``, other
platforms and anything else keep ``optimizers``' JAX rule, so a torch-free artifact never
names the custom call. Where the library is not built for the running jaxlib, XLA's kernels
run (the setting's ``native`` falls back without a word, as the layout copy's does).
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np

from jax_backend import config, ffi_libraries, optimizers, target

LIBRARY = ffi_libraries.FUSED_OPTIMIZER
ADAM_TARGET, SGD_TARGET = (name for name, _ in LIBRARY.targets)

#: The float32 hyperparameters operands, in the library's order (``Hyper``, ``SgdHyper``).
ADAM_HYPERPARAMETERS = ("beta1", "1-beta1", "beta2", "1-beta2", "eps", "weight_decay", "l2", "lr")
SGD_HYPERPARAMETERS = ("momentum", "1-dampening", "weight_decay", "lr")

#: The rules the library runs as ``adam_base``.
_ADAM_FAMILY = {"adam_base", "adam", "adamw"}


def wanted(platform: str, layout) -> bool:
    """Whether a program for ``platform`` (on one device when ``layout`` is None) runs the
    Adam family's and SGD's updates natively: a CPU with one device, ``cpu_optimizer`` "native" and the
    library built for this jaxlib."""
    return LIBRARY.wanted(platform, layout, config.cpu_optimizer)


def applies() -> bool:
    """Whether the current lowering may run the fused update (``Target.native_optimizer``)."""
    return target.current().native_optimizer


def adam_base_arguments(name: str, hyperparams: dict) -> dict | None:
    """``adam_base``'s arguments for the rule ``name`` with ``hyperparams`` (None: not the
    Adam family, or hyperparameters its factory would refuse)."""
    args = _arguments(name, hyperparams) if name in _ADAM_FAMILY else None
    if args is None:
        return None
    if name == "adam":  # Adam's weight decay is coupled L2; bias correction always on
        args["l2_regularization_rate"], args["weight_decay"] = args["weight_decay"], 0.0
        args["correct_bias"] = True
    elif name == "adamw":
        args["l2_regularization_rate"] = 0.0
    return args


def update(name: str, hyperparams: dict, params, grads, state_leaves, treedef):
    """The fused update of the rule ``name``: ``(new_params, new_state_leaves)`` as
    ``optimizers.apply`` returns them, or None where the library does not run this update
    (another rule, a dtype other than float32), which then goes to ``optimizers.apply``."""
    if not params or LIBRARY.unavailable() is not None:  # (loads the library once)
        return None
    state = jax.tree.unflatten(treedef, list(state_leaves))
    if name == "sgd" and isinstance(state, optimizers.SGDState):
        return _sgd(hyperparams, params, grads, state)
    args = adam_base_arguments(name, hyperparams)
    if args is not None and isinstance(state, optimizers.AdamState):
        return _adam(args, params, grads, state)
    return None


def _arguments(name: str, hyperparams: dict) -> dict | None:
    """The rule ``name``'s factory arguments, defaults filled in (None: hyperparameters the
    factory would refuse)."""
    try:
        bound = inspect.signature(optimizers.OPTIMIZERS[name]).bind(**hyperparams)
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def _adam(args: dict, params, grads, state):
    amsgrad = state.max_exp_avg_sq is not None
    correct_bias = state.beta1_power is not None
    fields = [params, grads, state.exp_avg, state.exp_avg_sq]
    if amsgrad:
        fields.append(state.max_exp_avg_sq)
    if correct_bias:
        fields += [state.beta1_power, state.beta2_power]
    beta1, beta2 = args["betas"][0], args["betas"][1]
    rate = args["l2_regularization_rate"]
    hyper = {
        "beta1": beta1,
        "1-beta1": 1.0 - beta1,
        "beta2": beta2,
        "1-beta2": 1.0 - beta2,
        "eps": args["eps"],
        "weight_decay": args["weight_decay"],
        "l2": rate,
        "lr": args["learning_rate"],
    }
    out = _call(
        ADAM_TARGET,
        fields,
        [hyper[name] for name in ADAM_HYPERPARAMETERS],
        amsgrad=amsgrad,
        correct_bias=correct_bias,
        l2=optimizers.adds_l2(rate),
    )
    if out is None:
        return None
    new_params, new = out
    new_state = state._replace(
        exp_avg=new[0],
        exp_avg_sq=new[1],
        **({"max_exp_avg_sq": new[2]} if amsgrad else {}),
        **({"beta1_power": new[-2], "beta2_power": new[-1]} if correct_bias else {}),
    )
    return new_params, jax.tree.leaves(new_state)


def _sgd(hyperparams: dict, params, grads, state):
    args = _arguments("sgd", hyperparams)
    if args is None:
        return None
    momentum = state.momentum_buffer is not None
    fields = [params, grads] + ([state.momentum_buffer] if momentum else [])
    hyper = {
        "momentum": args["momentum"],
        "1-dampening": 1.0 - args["dampening"],
        "weight_decay": args["weight_decay"],
        "lr": args["learning_rate"],
    }
    out = _call(
        SGD_TARGET,
        fields,
        [hyper[name] for name in SGD_HYPERPARAMETERS],
        momentum=momentum,
        nesterov=bool(momentum and args["nesterov"]),
        maximize=bool(args["maximize"]),
    )
    if out is None:
        return None
    new_params, new = out
    new_state = state._replace(momentum_buffer=new[0]) if momentum else state
    return new_params, jax.tree.leaves(new_state)


def _call(target_name: str, fields, hyper, **attributes):
    """The custom call ``target_name`` on ``fields`` (lists of one array per parameter:
    the parameters, their gradients, then the state fields) and the float32 ``hyper``:
    ``(new parameters, [new state field, ...])``, each written in place of the array it
    replaces. None where an array is not float32, or a hyperparameter is an array or numpy
    scalar of another dtype (the JAX rule would then compute in that dtype)."""
    if any(jnp.result_type(a) != jnp.float32 for field in fields for a in field):
        return None
    if any(getattr(h, "dtype", jnp.float32) != jnp.float32 for h in hyper):
        return None
    count = len(fields[0])
    written = fields[:1] + fields[2:]  # all but the gradients
    results = [jax.ShapeDtypeStruct(a.shape, a.dtype) for field in written for a in field]
    operands = [a for field in fields for a in field] + [jnp.stack([_float32(h) for h in hyper])]
    # Result field f is operand field f + 1 but for the parameters (operand field 0).
    aliases = {
        (0 if f == 0 else f + 1) * count + i: f * count + i
        for f in range(len(written))
        for i in range(count)
    }
    call = LIBRARY.call(target_name, results, input_output_aliases=aliases)
    out = list(call(*operands, count=np.int64(count), **attributes))
    new = [out[k * count : (k + 1) * count] for k in range(len(written))]
    return new[0], new[1:]


def _float32(value):
    """A hyperparameter as the rule's float32 arithmetic sees it: a Python number (computed
    in double, as ``1.0 - beta`` is) rounded once; a traced one cast."""
    return jnp.asarray(value, dtype=jnp.float32)
