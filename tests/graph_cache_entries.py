"""Editing graph-cache entries in tests (tampered, damaged or altered entries).

An entry is ``MAGIC``, an HMAC, then a zip payload. An edit keeps the old HMAC unless
``sign=True``: kept, it is what an attacker without the secret can do (the cache must refuse
it); signed again with the directory's secret, it tests the decoder's own checks, which stand
behind the HMAC.
"""

import io
import json
import os
from pathlib import Path

import numpy as np

from jax_backend import graph_cache
from jax_backend.graph_cache import storage

_HEAD = len(graph_cache.MAGIC) + 32


def rewrite_payload(path, edit, sign=False):
    """Replaces an entry's payload (the zip) with ``edit(payload bytes)``."""
    path = os.fspath(path)
    data = Path(path).read_bytes()
    head, payload = data[:_HEAD], edit(data[_HEAD:])
    if sign:
        directory = os.path.dirname(path)
        secret = (Path(directory) / graph_cache.SECRET).read_bytes()
        key = os.path.basename(path).removesuffix(".npz")
        head = graph_cache.MAGIC + storage.mac(secret, key, payload)
    with open(path, "wb") as f:
        f.write(head + payload)


def rewrite_entry(path, edit, sign=False):
    """Rewrites an entry's JSON with ``edit(doc)`` (keeping its constants), re-zipped as the
    cache writes it."""

    def rewrite(payload):
        with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        doc = json.loads(arrays["entry"].tobytes())
        edit(doc)
        arrays["entry"] = np.frombuffer(json.dumps(doc).encode(), np.uint8)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    rewrite_payload(path, rewrite, sign)


def first_node(doc, op_prefix):
    """The entry's first node whose op target starts with ``op_prefix``."""
    return next(n for n in doc["nodes"] if isinstance(n[1], str) and n[1].startswith(op_prefix))
