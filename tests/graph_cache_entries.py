"""Editing graph-cache entries in tests (tampered, damaged or altered entries)."""

import json

import numpy as np


def rewrite_entry(path, edit):
    """Rewrites an entry's JSON with ``edit(doc)`` (keeping its constants)."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    doc = json.loads(arrays["entry"].tobytes())
    edit(doc)
    arrays["entry"] = np.frombuffer(json.dumps(doc).encode(), np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def first_node(doc, op_prefix):
    """The entry's first node whose op target starts with ``op_prefix``."""
    return next(n for n in doc["nodes"] if isinstance(n[1], str) and n[1].startswith(op_prefix))
