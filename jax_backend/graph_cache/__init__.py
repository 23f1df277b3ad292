"""A persistent cache of captured steps, so a second run of an unchanged script skips capture.

**Off unless asked for** (``CSTORCH_GRAPH_CACHE=DIR``, or ``on`` for
``$XDG_CACHE_HOME/cstorch-jax/graphs``): a hit replays the graph of an earlier process, so
it is only right if the key covers everything the step read while it was traced, and some
reads (the time, a network answer, a file read by C code) cannot be keyed. JAX's persistent
cache (``compilation_cache``, on by default, never stale) already skips XLA compilation;
this cache skips the capture on top of it (about a second on a small model).

One job per module:

* ``fingerprint``: the Python values a step depends on (its code and everything reachable);
* ``key``: the entry's key (``step_key``), a list of named parts (``StepKey``): that
  fingerprint's parts, the process-wide values the config layers declare, the process's
  inputs (``process_inputs``), the state and inputs, the caller's program selection and
  the library versions (``versions``);
* ``explain``: which parts of a missed key differ from the step's stored entries, and the
  diagnostics a user turns on with ``CSTORCH_GRAPH_CACHE_EXPLAIN=1`` (``report``);
* ``sources``: the files an entry depends on (loaded modules, files the capture opened:
  ``watching_capture``) and the check that they are unchanged on load;
* ``codec``: a ``CapturedStep`` as authenticated-then-checked data (``pack``/``unpack``,
  ``encode``/``decode``): a closed set of value kinds, every op resolved to a lowered
  overload, nothing executed, bounds on every size;
* ``storage``: the directory (private to this user), its secret and the HMAC of each entry,
  and ``load``/``store``/``discard``.

The directory is safe to delete at any time. A caller (cstorch's ``capture_cache``) supplies
the fingerprint's roots and what selects a program, and decides when not to cache.
"""

from jax_backend.graph_cache import explain as explain, fingerprint as fingerprint
from jax_backend.graph_cache.codec import (
    MAX_DEPTH as MAX_DEPTH,
    MAX_DIM as MAX_DIM,
    MAX_FILE_BYTES as MAX_FILE_BYTES,
    MAX_JSON_BYTES as MAX_JSON_BYTES,
    MAX_NODES as MAX_NODES,
    MAX_RANK as MAX_RANK,
    CorruptEntry as CorruptEntry,
    decode as decode,
    encode as encode,
)
from jax_backend.graph_cache.explain import report as report
from jax_backend.graph_cache.key import (
    FORMAT as FORMAT,
    IGNORED_ENVIRONMENT as IGNORED_ENVIRONMENT,
    StepKey as StepKey,
    process_inputs as process_inputs,
    step_key as step_key,
    versions as versions,
)
from jax_backend.graph_cache.sources import (
    CaptureRecord as CaptureRecord,
    loaded_source_files as loaded_source_files,
    source_files as source_files,
    watching_capture as watching_capture,
)
from jax_backend.graph_cache.storage import (
    ENV_VAR as ENV_VAR,
    EVENT_HIT as EVENT_HIT,
    EVENT_MISS as EVENT_MISS,
    EVENT_STORE as EVENT_STORE,
    MAGIC as MAGIC,
    SECRET as SECRET,
    SECRET_BYTES as SECRET_BYTES,
    Entry as Entry,
    GraphCacheWarning as GraphCacheWarning,
    default_directory as default_directory,
    discard as discard,
    load as load,
    logger as logger,
    store as store,
)
