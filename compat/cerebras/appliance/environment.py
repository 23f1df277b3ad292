"""``appliance_environ``: environment variables meant for the processes that run the job.

On a cluster these are forwarded to the worker processes. Here the workers are this process,
so a variable set through ``appliance_environ`` is also set in ``os.environ`` (and removed from
it when deleted); the mapping itself lists only what was set through it.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping


class _ApplianceEnviron(MutableMapping):
    def __init__(self):
        self._vars: dict[str, str] = {}

    def __getitem__(self, key):
        return self._vars[key]

    def __setitem__(self, key, value):
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"Environment variable names and values must be str, got {key!r}={value!r}."
            )
        self._vars[key] = value
        os.environ[key] = value

    def __delitem__(self, key):
        del self._vars[key]
        os.environ.pop(key, None)

    def __iter__(self):
        return iter(self._vars)

    def __len__(self):
        return len(self._vars)

    def __repr__(self):
        return f"appliance_environ({self._vars!r})"


appliance_environ = _ApplianceEnviron()
