"""``cerebras_appliance.run_utils`` as releases 1.7 to 1.9 had it: reading debug args and
filling in the autogen policy and memory limits the 1.x appliance runner passes on.

The 1.x ``DebugArgs`` is the attribute-style message of ``pb.workflow...common_config_pb2``.
A debug-args file here is JSON (``{"debug_ini": {"frozen_content": "..."}}``); a protobuf
text file from a real cluster is refused with the reason rather than half read.
"""

from __future__ import annotations

import json

from cerebras_appliance.pb.stack.autogen_pb2 import AutogenPolicy
from cerebras_appliance.pb.workflow.appliance.common.common_config_pb2 import DebugArgs


def get_debug_args(path: str) -> DebugArgs:
    with open(path) as f:
        text = f.read()
    try:
        loaded = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        raise ValueError(f"Cannot read debug args from {path!r}: this implementation reads "
                         "JSON ({\"debug_ini\": {\"frozen_content\": \"...\"}}), not protobuf "
                         "text format.") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"Debug args file {path!r} must hold a JSON object.")
    debug_args = DebugArgs()
    for name, value in loaded.items():
        if name == "debug_ini":
            if not isinstance(value, dict) or set(value) - {"frozen_content"}:
                raise ValueError(f"{path!r}: debug_ini must be an object with only "
                                 "'frozen_content'.")
            debug_args.debug_ini.frozen_content = str(value.get("frozen_content", ""))
        else:
            setattr(debug_args, name, value)
    return debug_args


def update_debug_args_with_autogen_policy(debug_args: DebugArgs, autogen_policy=None) -> None:
    """Records the autogen policy (``"disabled"``, ``"medium"``, ...) in the debug ini; the
    engine has no autogen pass, so it is only validated."""
    if autogen_policy is None:
        return
    name = f"AP_{str(autogen_policy).upper()}"
    AutogenPolicy.Value(name)  # raises naming the valid ones
    debug_args.debug_ini.frozen_content += f"autogen_policy: {name}\n"


def update_debug_args_with_mem_limits(debug_args: DebugArgs, runconfig: dict) -> None:
    """Memory limits of the cluster's servers (``*_memory_gi`` in the runconfig): recorded in
    the debug ini; the modeled wafer runs in this process and uses none of them."""
    for key in sorted(runconfig or {}):
        if key.endswith("_memory_gi") and runconfig[key] is not None:
            debug_args.debug_ini.frozen_content += f"{key}: {runconfig[key]}\n"
