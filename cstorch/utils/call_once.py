"""``call_once``: a decorator that runs a function once and returns its first result ever after."""

from __future__ import annotations

import functools
import threading
from typing import Callable, Optional


def call_once(error_callable: Optional[Callable[[], None]] = None):
    """Decorator factory: the wrapped function runs on its first call only.

    Later calls return the first call's result without running the function; when
    ``error_callable`` is given it is called first on each of them (it may warn or raise).
    Thread safe.
    """

    def decorator(fn):
        lock = threading.Lock()
        result = []

        @functools.wraps(fn)
        def once(*args, **kwargs):
            with lock:
                if not result:
                    result.append(fn(*args, **kwargs))
                    return result[0]
            if error_callable is not None:
                error_callable()
            return result[0]

        return once

    return decorator
