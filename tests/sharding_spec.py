"""How a test driver reports an array's ``PartitionSpec``: as JSON-able entries, since the
spec's repr changed between JAX releases (``PartitionSpec('csx',)`` before 0.10, ``P('csx',)``
from 0.10)."""


def spec_entries(sharding):
    """``[["csx", "ws"]]`` for ``P(('csx', 'ws'),)``, ``[]`` for ``P()``, None without a spec;
    trailing unsharded dimensions are dropped, as they mean the same layout."""
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return None
    entries = [list(e) if isinstance(e, tuple) else e for e in spec]
    while entries and entries[-1] is None:
        entries.pop()
    return entries
