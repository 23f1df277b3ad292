"""Debug arguments of a (modeled) appliance run: ``cstorch.backends.csx.debug.debug_args``.

The reference stores them as a protobuf message written in protobuf text format. Here they are
a ``DebugArgs`` dict, written and read as JSON; a protobuf-text file from a real cluster is
refused with a clear error instead of being half understood.
"""

from __future__ import annotations

import json
from typing import Union

from cstorch.backends import DebugArgs


def write_debug_args(debug_args: DebugArgs, path: str) -> None:
    with open(path, "w") as f:
        json.dump(debug_args, f, indent=1, sort_keys=True)


def get_debug_args(value: Union[DebugArgs, str, None]) -> DebugArgs:
    """``value`` itself when it is DebugArgs, else the DebugArgs read from the file it names
    (empty DebugArgs for None or "")."""
    if isinstance(value, DebugArgs):
        return value
    debug_args = DebugArgs()
    if value:
        with open(value) as f:
            text = f.read()
        try:
            loaded = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError:
            raise ValueError(
                f"Cannot read debug args from {value!r}: this implementation reads the JSON "
                "files that write_debug_args writes, not protobuf text format. Rewrite the "
                "settings as a JSON object."
            ) from None
        if not isinstance(loaded, dict):
            raise ValueError(f"Debug args file {value!r} must hold a JSON object.")
        debug_args.MergeFrom(loaded)
    return debug_args


def update_debug_args_from_keys(debug_args: DebugArgs, flat_dargs: dict) -> None:
    """Sets dotted keys (``"debug_usr.skip_image_build": True``) in ``debug_args``."""
    for dotted, value in flat_dargs.items():
        *parents, leaf = dotted.split(".")
        node = debug_args
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"Cannot set {dotted!r}: {part!r} is not a message.")
        node[leaf] = value
