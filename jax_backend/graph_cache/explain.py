"""Why a step is captured again: which parts of its key differ from the step's stored
entries, and the diagnostics a user can turn on.

**Diagnostics.** Every hit, miss, store and step that is not cached is a message of the
``jax_backend.graph_cache`` logger (``logger``), at debug level; with
``CSTORCH_GRAPH_CACHE_EXPLAIN=1`` (the ``graph_cache_explain`` setting of
``jax_backend.config``) misses and steps that are not cached are warnings, which Python
prints on stderr when logging is not configured (``report``).

**What a miss differs in.** Each stored entry of a step with a name (``StepKey.step``) is
recorded in the step's file ``<sha256 of the name>.step`` in the cache directory: the parts
of its last ``HISTORY`` stored keys (``record``), part names and digests shortened to
``SHORT`` hex digits, never the values. A miss for want of an entry compares its key with
each and names the parts that differ from the nearest (``explain``): "differs from the
step's stored entry in 1 part: environment variable STEP_SCALE". The file is written like an
entry (atomically, 0600, with an HMAC under the directory's secret) and read with the same
care; a file that is missing, foreign or malformed explains nothing and is replaced at the
next store.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os

from jax_backend.atomic_files import write_file
from jax_backend.config import graph_cache_explain
from jax_backend.errors import CstorchValueError
from jax_backend.graph_cache.key import StepKey
from jax_backend.regular_files import open_regular

logger = logging.getLogger("jax_backend.graph_cache")

#: How many stored keys of a step its file keeps (a step's programs each have one).
HISTORY = 8
#: Hex digits of a part's digest kept in a step's file: enough to tell a change.
SHORT = 16
MAGIC = b"cstorch-graph-cache steps 1\n"
MAX_BYTES = 4 * 1024 * 1024


def explaining() -> bool:
    """Whether the user asked for the diagnostics (``CSTORCH_GRAPH_CACHE_EXPLAIN``)."""
    return bool(graph_cache_explain.value)


def report(message: str, *args) -> None:
    """A miss or a step not cached: a warning while ``explaining()``, else a debug message."""
    logger.log(logging.WARNING if explaining() else logging.DEBUG, message, *args)


def _path(directory: str, step: str) -> str:
    return os.path.join(directory, hashlib.sha256(step.encode()).hexdigest() + ".step")


def _mac(secret: bytes, step: str, payload: bytes) -> bytes:
    return hmac.new(secret, MAGIC + step.encode() + b"\0" + payload, hashlib.sha256).digest()


def _is_record(entry) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("key"), str)
        and isinstance(entry.get("parts"), list)
        and all(
            isinstance(p, list)
            and len(p) == 2
            and isinstance(p[0], str)
            and isinstance(p[1], str)
            and p[1]
            for p in entry["parts"]
        )
    )


def recorded(directory: str, secret: bytes, step: str) -> list:
    """The step's recorded keys, oldest first: ``[{"key": digest, "parts": [[name, short
    digest], ...]}, ...]``; empty if there is no file or it is not one this cache wrote."""
    path = _path(directory, step)
    try:
        fd = open_regular(path, "graph cache step record", follow_symlinks=False)
        with os.fdopen(fd, "rb") as f:
            if os.fstat(f.fileno()).st_uid != os.geteuid():
                raise CstorchValueError("owned by another user")
            data = f.read(MAX_BYTES + 1)
        head = len(MAGIC) + hashlib.sha256().digest_size
        payload = data[head:]
        if (
            len(data) > MAX_BYTES
            or data[: len(MAGIC)] != MAGIC
            or not hmac.compare_digest(data[len(MAGIC) : head], _mac(secret, step, payload))
        ):
            raise CstorchValueError("not a step record of this cache")
        doc = json.loads(payload)
        if not (
            isinstance(doc, dict)
            and doc.get("step") == step
            and isinstance(doc.get("entries"), list)
            and all(map(_is_record, doc["entries"]))
        ):
            raise CstorchValueError("malformed")
        return doc["entries"]
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as err:  # json's errors are ValueErrors
        logger.debug("graph cache: ignoring the step record %s: %s", path, err)
        return []


def record(directory: str, secret: bytes, key) -> None:
    """Adds ``key`` (a ``StepKey`` with a step name; anything else is not recorded) to its
    step's record, as its newest entry."""
    if not isinstance(key, StepKey) or not key.step:
        return
    entries = [e for e in recorded(directory, secret, key.step) if e["key"] != key.digest]
    entries.append(
        {"key": key.digest, "parts": [[name, digest[:SHORT]] for name, digest in key.parts]}
    )
    payload = json.dumps({"step": key.step, "entries": entries[-HISTORY:]}).encode()
    try:
        write_file(
            _path(directory, key.step),
            MAGIC + _mac(secret, key.step, payload) + payload,
            mode=0o600,
        )
    except OSError as err:
        logger.debug("graph cache: cannot record %s: %s", key.step, err)


def explain(directory: str, secret: bytes, key) -> str:
    """Why no entry is stored under ``key``: the parts in which it differs from the nearest
    of its step's recorded keys (the newest of the nearest), in words."""
    if not isinstance(key, StepKey) or not key.step:
        return "no entry"
    entries = recorded(directory, secret, key.step)
    if not entries:
        return "no entry of this step is stored"
    nearest = min(
        reversed(range(len(entries))), key=lambda i: len(key.differences(entries[i]["parts"]))
    )
    differences = key.differences(entries[nearest]["parts"])
    if not differences:
        return "the step's entry under this key was removed"
    which = "stored entry" if len(entries) == 1 else f"nearest of {len(entries)} stored entries"
    count = "1 part" if len(differences) == 1 else f"{len(differences)} parts"
    return f"its key differs from the step's {which} in {count}: {', '.join(differences)}"
