"""``cstorch.backends``: the tree of configuration flags (``backends.csx.<group>.<flag>``).

The flags mirror cerebras-pytorch 2.10. Most of them configure the wafer-scale compiler and
appliance, which this implementation models but does not have; they are kept, validated and
readable so that scripts and configs written for the reference run unchanged. Flags that
have an effect here: ``csx.precision.optimization_level`` (read by ``cstorch.current_pol``),
``csx.performance.transfer_processes`` (checkpoint I/O threads) and
``csx.performance.compress_weights`` (checkpoint metadata), and ``csx.storage.s3.profile``
(the ``AWS_PROFILE`` environment variable).

On the CSX backend a flag may not change while a data executor is running (RuntimeError), as
on a real system where the flags are compiled into the run. Code a traced step calls reads
the flags (``cstorch.current_pol``), so they are a part of the graph cache's key
(``flag_values``).
"""

import dataclasses
import os
import sys
from typing import Any, List, Literal, Optional, Union

from cstorch import config
from cstorch.utils import _flags as _flags_module
from cstorch.utils._flags import DEFAULT, _flags, flag
from jax_backend.config import positive_int
from jax_backend.errors import CstorchRuntimeError, CstorchTypeError, CstorchValueError

MAX_TRANSFER_BYTES = 256 * 1024 * 1024
MAX_MESSAGE_LENGTH = 2 * 1024 * 1024 * 1024 - 1024


class INI(dict):
    """Debug INI settings passed to the (modeled) compiler: a dict of name -> value."""


class DebugArgs(dict):
    """Appliance debug arguments: a dict of name -> value (nested dicts for sub-messages).

    ``MergeFrom(other)`` merges like the reference's protobuf message does: nested mappings
    merge key by key, lists are extended, any other value of ``other`` replaces this one's.

    Fields are also attributes, as on the protobuf message the Model Zoo (2.0-2.3) writes
    through: ``debug_args.debug_usr.worker_resource.memory_bytes = n``. Reading a sub-message
    that is not set gives an empty one that joins its parent only when something is set in
    it, so reading never adds fields.
    """

    def MergeFrom(self, other) -> None:  # the protobuf method name
        if not isinstance(other, dict):
            raise CstorchTypeError(
                f"DebugArgs.MergeFrom expects DebugArgs or a dict, got {type(other).__name__}."
            )
        _merge_into(self, other)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self:
            child = DebugArgs()
            child.__dict__["_attach_to"] = (self, name)
            return child
        value = self[name]
        if type(value) is dict:  # a sub-message read from a file: give it attributes too
            value = DebugArgs(value)
            dict.__setitem__(self, name, value)
        return value

    def __setattr__(self, name, value):
        if name.startswith("_"):
            raise AttributeError(f"DebugArgs has no field {name!r}")
        self[name] = value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        attach = self.__dict__.pop("_attach_to", None)
        if attach is not None and attach[1] not in attach[0]:
            parent, name = attach
            parent[name] = self


def _merge_into(target: dict, source: dict) -> None:
    for key, value in source.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_into(target[key], value)
        elif isinstance(value, list) and isinstance(target.get(key), list):
            target[key].extend(value)
        else:
            target[key] = value


def _optimization_level(name, value):
    if value not in (0, 1, 2):
        raise CstorchValueError(f"{name} must be an integer in range [0, 3). Got {value!r}.")
    return value


_MICRO_BATCH_HELP = (
    'Expected one of:\n\t"auto": choose an optimal micro batch size.\n\t"explore": search for '
    'an optimal micro batch size and return.\n\t{"explore": {"min": <positive_int>, "max": '
    "<positive_int>}}: search within bounds.\n\t<positive_int>: use this micro batch size."
    "\n\tNone: disable micro batch tiling."
)


def _micro_batch_size(name, value):
    if value is None or value in ("auto", "explore"):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, dict) and set(value) == {"explore"} and isinstance(value["explore"], dict):
        bounds = value["explore"]
        if set(bounds) <= {"min", "max"} and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in bounds.values()
        ):
            return value
    raise CstorchValueError(f'Invalid value {value!r} for "{name}". {_MICRO_BATCH_HELP}')


def _positive_int(name, value):
    try:
        return positive_int(value)
    except ValueError as error:
        raise CstorchValueError(f"{name} {error}, got {value!r}.") from None


def _transfer_bytes(name, value):
    if not 0 <= value <= MAX_MESSAGE_LENGTH:
        raise CstorchValueError(
            f"{name} must be an integer in [0, {MAX_MESSAGE_LENGTH}], got {value!r}."
        )
    return value


def _non_negative_or_none(name, value):
    if value is not None and value < 0:
        raise CstorchValueError(
            f"{name} must be a non-negative number of GiB or None, got {value!r}."
        )
    return value


def _to_ini(name, value):
    return value if isinstance(value, INI) else INI(value)


def _to_debug_args(name, value):
    return value if isinstance(value, DebugArgs) else DebugArgs(value)


def _aws_profile(name, value):
    if isinstance(value, str):
        os.environ["AWS_PROFILE"] = value
    else:
        os.environ.pop("AWS_PROFILE", None)
    return value


@dataclasses.dataclass(repr=False)
class _backends(_flags):
    """Backend configuration flags. ``backends.DEFAULT`` resets a flag when assigned."""

    DEFAULT = DEFAULT

    @dataclasses.dataclass(repr=False)
    class _csx(_flags):
        """CSX flags: precision, performance, cluster, storage and debug groups."""

        @dataclasses.dataclass(repr=False)
        class _precision(_flags):
            """``optimization_level``: the precision optimization level (POL), 0, 1 or 2."""

            optimization_level: int = flag(1, validate=_optimization_level)

        @dataclasses.dataclass(repr=False)
        class _performance(_flags):
            """Micro-batching, host<->device transfer and weight compression settings."""

            micro_batch_size: Any = flag("auto", validate=_micro_batch_size)
            transfer_processes: int = flag(5, validate=_positive_int)
            max_transfer_bytes: int = flag(MAX_TRANSFER_BYTES, validate=_transfer_bytes)
            compress_weights: bool = False
            use_speculative_optimizers: bool = True

        @dataclasses.dataclass(repr=False)
        class _cluster(_flags):
            """``auto_taint``: taint systems automatically when a taint action is found."""

            auto_taint: bool = False

        @dataclasses.dataclass(repr=False)
        class _storage(_flags):
            """Checkpoint storage settings."""

            @dataclasses.dataclass(repr=False)
            class _s3(_flags):
                """``profile``: the AWS profile (the ``AWS_PROFILE`` environment variable)."""

                profile: Optional[str] = flag(None, validate=_aws_profile)

                def __getattribute__(self, name):
                    if name == "profile":
                        return os.environ.get("AWS_PROFILE")
                    return super().__getattribute__(name)

            s3: _s3 = dataclasses.field(default_factory=_s3)

        @dataclasses.dataclass(repr=False)
        class _debug(_flags):
            """Debugging and initialization settings."""

            ini: Union[INI, dict] = flag(validate=_to_ini, default_factory=INI)
            debug_args: Union[DebugArgs, dict] = flag(
                validate=_to_debug_args, default_factory=DebugArgs
            )
            drop_data: bool = False
            lazy_initialization: bool = True
            skip_weight_init: bool = False
            optimize_initialization: bool = True
            log_initialization: bool = True
            retrace_every_iteration: bool = False
            implicit_cast_cb16_to_fp32: bool = False
            save_gpv: bool = False
            check_constraints: bool = False
            op_definition_module: Optional[str] = None
            skip_connectivity_check: bool = False
            fabric_type_blacklist: Optional[List[Literal["cs2", "cs3"]]] = None
            compile_crd_memory_gi: Optional[int] = flag(None, validate=_non_negative_or_none)
            execute_crd_memory_gi: Optional[int] = flag(None, validate=_non_negative_or_none)
            wrk_memory_gi: Optional[int] = flag(None, validate=_non_negative_or_none)
            act_memory_gi: Optional[int] = flag(None, validate=_non_negative_or_none)
            cmd_memory_gi: Optional[int] = flag(None, validate=_non_negative_or_none)
            wgt_memory_gi: Optional[int] = flag(None, validate=_non_negative_or_none)
            chf_memory_gi: Optional[int] = flag(None, validate=_non_negative_or_none)

        precision: _precision = dataclasses.field(default_factory=_precision)
        performance: _performance = dataclasses.field(default_factory=_performance)
        cluster: _cluster = dataclasses.field(default_factory=_cluster)
        storage: _storage = dataclasses.field(default_factory=_storage)
        debug: _debug = dataclasses.field(default_factory=_debug)

    csx: _csx = dataclasses.field(default_factory=_csx)


def _refuse_changes_during_csx_run(group, name) -> None:
    # Read through sys.modules, not imported: cstorch.backend sets flags from its old
    # keywords (cstorch.backend.old_keywords), and no backend exists before it is loaded.
    backend_module = sys.modules.get("cstorch.backend")
    if backend_module is None:
        return
    impl = backend_module.current_backend_impl(raise_exception=False)
    if impl is not None and impl.is_csx and impl.data_executor_stack:
        raise CstorchRuntimeError(
            f"Cannot change the backends flag `{name}` of {type(group).__name__.lstrip('_')} "
            "while a run is in progress on the CSX backend: flags are compiled into the run. "
            "Set flags before iterating the DataExecutor."
        )


_flags_module.change_guard = _refuse_changes_during_csx_run

backends: _backends = _backends()


def flag_values() -> dict:
    """The flags as plain data, every mapping a dict and every sequence a list (``DebugArgs``
    makes sub-messages on attribute reads, protobuf manners, which a fingerprint would walk
    without end): the graph cache's key part ``cstorch.backends``."""

    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(backends.asdict())


config.config.include_in_graph_key("cstorch.backends", flag_values)

__all__ = ["backends", "DEFAULT"]
