"""``cerebras_appliance``: the import name of ``cerebras.appliance`` in releases 1.6 to 2.1.

``cerebras_appliance.X`` is the very module ``cerebras.appliance.X`` wherever the project
has that module (same objects, so classes and isinstance checks are shared). A submodule the
newer name does not have (a name only the older releases used) is looked up in this
package's own directory, so older-only modules live here, beside this file.

A real ``cerebras_appliance`` install earlier on the path is imported instead of this one and
shadows it whole (the alias finder is installed only when this package is imported).
"""

import cerebras.appliance as _appliance
from cstorch.utils._import_alias import AliasFinder as _AliasFinder, add_finder as _add_finder

_add_finder(_AliasFinder("cerebras_appliance", "cerebras.appliance"))

__version__ = "2.1.1"  # the newest API generation that used this name

# 1.6-1.9: the compile cache folder the zoo's runners default to (see CSConfig.py).
from cerebras_appliance.CSConfig import DEFAULT_COMPILE_DIR  # noqa: E402,F401


def __getattr__(name):
    return getattr(_appliance, name)
