"""Utilities: data loading and execution, step closures, profiling, summaries.

``cstorch.utils.tensorboard`` should be imported explicitly (it is not loaded with this
package; reading the attribute first loads it with a warning, as releases up to 2.2 had it
loaded); ``cstorch.utils.CSConfig`` (2.0/2.1) is deprecated in favour of
``cstorch.distributed.ClusterConfig``.
"""

from cstorch.utils import (
    benchmark as benchmark,
    data as data,
    nest as nest,
    step_closures as step_closures,
    tracker as tracker,
)
from cstorch.utils.constant import make_constant as make_constant
from cstorch.utils.data import (
    DataExecutor as DataExecutor,
    DataLoader,
    RestartableDataLoader as RestartableDataLoader,
    SyntheticDataset,
)
from cstorch.utils.step_closures import (
    checkpoint_closure as checkpoint_closure,
    step_closure as step_closure,
)


def __getattr__(name):
    if name == "CSConfig":
        from cstorch.utils._cs_config import CSConfig

        return CSConfig
    if name == "tensorboard":
        # cerebras-pytorch 2.10 warns and raises AttributeError here; releases up to 2.2
        # loaded the module with the package, and their Model Zoo reads it as an attribute.
        # It is loaded (with 2.10's warning) so those scripts run.
        import importlib
        import warnings

        warnings.warn(
            "cstorch.utils.tensorboard must be imported before it can be accessed:\n\n"
            "\timport cerebras.pytorch.utils.tensorboard\n",
            stacklevel=2,
        )
        return importlib.import_module("cstorch.utils.tensorboard")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DataLoader", "SyntheticDataset"]
