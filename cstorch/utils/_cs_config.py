"""``cstorch.utils.CSConfig``: the 2.0-2.2 cluster settings, kept as a deprecated spelling of
``cstorch.distributed.ClusterConfig`` (which replaced it in 2.3)."""

from __future__ import annotations

import warnings

from jax_backend.errors import CstorchTypeError

# 2.0-2.2 settings that ClusterConfig has no field for: the engine has no use for them
# (``fabric_type_blacklist``, 2.2: fabric types the cluster must not schedule the job on).
_NO_EQUIVALENT = (
    "debug_args",
    "fabric_type_blacklist",
    "precision_opt_level",
    "transfer_processes",
)


def CSConfig(**kwargs):  # the historical class name
    """Builds the ``ClusterConfig`` that the 2.0/2.1 ``CSConfig(**kwargs)`` described.

    Pass it to ``cstorch.backend("CSX", cluster_config=...)``. Unknown keywords raise a
    TypeError naming them; settings without a ClusterConfig field are dropped with a warning.
    """
    from cstorch.distributed.cluster_config import ClusterConfig

    warnings.warn(
        "cstorch.utils.CSConfig is deprecated (cerebras_pytorch 2.0/2.1): use "
        "cstorch.distributed.ClusterConfig and pass it to the backend: "
        'cstorch.backend("CSX", cluster_config=ClusterConfig(...)).',
        DeprecationWarning,
        stacklevel=2,
    )
    fields = set(ClusterConfig.__dataclass_fields__)
    dropped = {k: v for k, v in kwargs.items() if k in _NO_EQUIVALENT}
    unknown = sorted(k for k in kwargs if k not in fields and k not in _NO_EQUIVALENT)
    if unknown:
        raise CstorchTypeError(
            f"CSConfig got unknown settings {unknown}; valid ones are "
            f"{sorted(fields | set(_NO_EQUIVALENT))}."
        )
    if any(v is not None for v in dropped.values()):
        warnings.warn(
            f"CSConfig settings {sorted(dropped)} have no effect on this engine and were dropped.",
            UserWarning,
            stacklevel=2,
        )
    # None meant "the default" in 2.0/2.1.
    return ClusterConfig(**{k: v for k, v in kwargs.items() if k in fields and v is not None})
