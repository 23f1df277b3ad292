"""``cerebras.appliance.run_utils``: where releases 2.0 to 2.2 of the Model Zoo import the
debug-args and INI helpers from (``cerebras_appliance.run_utils`` in 2.0/2.1). Later releases
moved them to ``cerebras.appliance.utils.debug_args`` and ``.utils.ini``; these are the same
functions."""

from cstorch.backends import DebugArgs
from cerebras.appliance.utils.debug_args import (
    get_debug_args,
    update_debug_args_from_keys,
    write_debug_args,
)
from cerebras.appliance.utils.ini import clear_ini, set_default_ini, set_ini

__all__ = ["DebugArgs", "clear_ini", "get_debug_args", "set_default_ini", "set_ini",
           "update_debug_args_from_keys", "write_debug_args"]
