"""``cerebras.appliance.run_utils``: where releases 2.0 to 2.2 of the Model Zoo import the
debug-args and INI helpers from (``cerebras_appliance.run_utils`` in 2.0/2.1). Later releases
moved them to ``cerebras.appliance.utils.debug_args`` and ``.utils.ini``; these are the same
functions."""

from cerebras.appliance.utils.debug_args import (
    get_debug_args,
    update_debug_args_from_keys,
    write_debug_args,
)
from cerebras.appliance.utils.ini import clear_ini, set_default_ini, set_ini
from cstorch.backends import DebugArgs

__all__ = [
    "DebugArgs",
    "clear_ini",
    "get_debug_args",
    "set_default_ini",
    "set_ini",
    "update_debug_args_from_keys",
    "write_debug_args",
]


# ---------------------------------------------------------------------- 1.7 to 1.9 helpers
# The 1.8/1.9 appliance runner builds a 1.x ``DebugArgs`` message
# (``cerebras_appliance.pb...common_config_pb2``) or reads one with ``get_debug_args`` (this
# module's dict-based ``DebugArgs``), then records its autogen policy and memory limits in the
# debug ini. The modeled wafer has no autogen pass and runs in this process, so they are only
# validated and recorded; both kinds of DebugArgs are accepted.

_AUTOGEN_POLICIES = ("disabled", "medium", "aggressive", "max")


def _append_to_debug_ini(debug_args, text: str) -> None:
    if isinstance(debug_args, dict):
        ini = debug_args.setdefault("debug_ini", {})
        ini["frozen_content"] = ini.get("frozen_content", "") + text
    else:
        debug_args.debug_ini.frozen_content += text


def update_debug_args_with_autogen_policy(debug_args, autogen_policy=None) -> None:
    """Records the autogen policy (``"disabled"``, ``"medium"``, ...) in the debug ini."""
    if autogen_policy is None:
        return
    if str(autogen_policy).lower() not in _AUTOGEN_POLICIES:
        raise ValueError(
            f"autogen_policy {autogen_policy!r} is not one of {list(_AUTOGEN_POLICIES)}."
        )
    _append_to_debug_ini(debug_args, f"autogen_policy: AP_{str(autogen_policy).upper()}\n")


def update_debug_args_with_mem_limits(debug_args, runconfig: dict) -> None:
    """Records the cluster servers' memory limits (``*_memory_gi`` keys of the runconfig)."""
    for key in sorted(runconfig or {}):
        if key.endswith("_memory_gi") and runconfig[key] is not None:
            _append_to_debug_ini(debug_args, f"{key}: {runconfig[key]}\n")


__all__ += ["update_debug_args_with_autogen_policy", "update_debug_args_with_mem_limits"]
