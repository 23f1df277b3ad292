"""Ctrl-C during a ``DataExecutor`` run stops it between two steps.

While an executor runs (in the main thread, with Python's own SIGINT handler in place), the
first Ctrl-C is noted and the executor raises ``KeyboardInterrupt`` at the next step boundary:
after the current step and its closures, before it draws the next batch. In the loop's
``except KeyboardInterrupt`` the loop variable then names the last step done, and the model,
optimizer and data position are those after it, so a checkpoint saved there resumes exactly
(docs/guide/checkpoints.md). A second Ctrl-C raises at once, wherever the run is (a step that
hangs can still be stopped); the state may then be between two steps.

A handler the user installed (or SIGINT ignored, as in a process started in the background)
is left alone. Nested executors (an eval loop inside a training loop) share the one handler;
each raises at its own step boundaries.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading


class _Pending:
    """Process-wide, as signals are: whether a Ctrl-C waits for the next step boundary."""

    interrupted = False


def _note_interrupt(signum, frame):
    if _Pending.interrupted:  # the second Ctrl-C: now
        _Pending.interrupted = False
        raise KeyboardInterrupt
    _Pending.interrupted = True
    sys.stderr.write(
        "\nKeyboardInterrupt: the run stops after the current step, once its "
        "state is whole (press Ctrl-C again to stop at once).\n"
    )
    sys.stderr.flush()


@contextlib.contextmanager
def deferred_to_step_boundaries():
    """Around an executor's run: a Ctrl-C is held for ``take_held`` (module docstring). Where
    the handler was already ours (a nested executor) or is not Python's default, nothing
    changes. A Ctrl-C still held when the outermost run ends is raised then."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    _Pending.interrupted = False
    signal.signal(signal.SIGINT, _note_interrupt)
    try:
        yield
    except BaseException:
        _restore()
        raise
    if _restore():
        raise KeyboardInterrupt


def _restore() -> bool:
    """Python's handler back; whether a Ctrl-C was still held."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    held, _Pending.interrupted = _Pending.interrupted, False
    return held


def take_held() -> bool:
    """Whether a Ctrl-C is held (it is then no longer): an executor asks between two steps,
    and raises KeyboardInterrupt if so."""
    held, _Pending.interrupted = _Pending.interrupted, False
    return held
