"""Exceptions raised by the JAX backend. Each message says what happened and what to do."""

from __future__ import annotations

import reprlib


class CstorchError(Exception):
    """The root of every error the engine (``jax_backend``) and the API (``cstorch``) raise.

    A mixin: each error also keeps its natural built-in base (``ValueError``, ``OSError``,
    ...), so ``except CstorchError`` catches all of them and ``except ValueError`` still works.
    """


# The project's own errors of each built-in kind: a raise site the project owns uses one of
# these (tests/test_code_rules.py), so ``except CstorchError`` sees every refusal of ours; the
# built-ins stay for Python's protocols (a missing key or attribute, an abstract method) and
# the operating system's conditions (a missing file).
class CstorchValueError(CstorchError, ValueError):
    """A value the project refuses: an argument, a setting, the content of a file."""


class CstorchTypeError(CstorchError, TypeError):
    """An argument of a type the project does not take."""


class CstorchRuntimeError(CstorchError, RuntimeError):
    """A call the project cannot carry out in the state it finds."""


class CstorchNotImplementedError(CstorchError, NotImplementedError):
    """Something the reference API offers that this engine does not (yet) model."""


class JaxBackendError(CstorchError, RuntimeError):
    """Base class of the backend's errors."""


class LoweringNotFoundError(CstorchError, NotImplementedError):
    """An ATen operator reached the lowering stage and no JAX lowering is registered for it."""

    def __init__(self, op, user_frame: str | None = None):
        self.op = op
        self.user_frame = user_frame
        where = f"\nIt was called from:\n{user_frame}" if user_frame else ""
        super().__init__(
            f"The ATen operator '{op}' has no JAX lowering, so this step cannot be compiled.{where}\n"
            "Rewrite that line with other torch operations, or register a lowering with "
            "`jax_backend.registry.lowers(torch.ops.aten.<op>.<overload>)`."
        )


class OpInputError(CstorchError, RuntimeError):
    """A lowering refused its inputs for the reason eager torch would (e.g. a float64 batch
    fed to a float32 matrix product): the user's input, not the lowering, is what to fix."""


class LoweringError(JaxBackendError):
    """A registered lowering raised while the step was lowered to JAX.

    Carries the ATen overload (``op``), the graph node's name, its inputs' shapes and dtypes
    (as torch saw them) and, when it could be found, the user's line that called the op."""

    def __init__(
        self, op, node: str, inputs: list, cause: BaseException, user_frame: str | None = None
    ):
        self.op, self.node, self.inputs, self.cause = op, node, inputs, cause
        self.user_frame = user_frame
        where = f"\nIt was called from:\n{user_frame}" if user_frame else ""
        described = f"'{op}' (graph node {node}, inputs: {', '.join(inputs) or 'none'})"
        if isinstance(cause, OpInputError):  # the inputs are wrong, as in eager torch
            super().__init__(
                f"The ATen operator {described} cannot run on these inputs: {cause}{where}"
            )
            return
        super().__init__(
            f"Lowering the ATen operator {described} failed with {type(cause).__name__}: "
            f"{cause}{where}\n"
            "This is a bug or a gap in that op's JAX lowering; rewrite that line with other "
            "torch operations, or report it with this message."
        )

    def with_user_frame(self, user_frame: str | None) -> "LoweringError":
        """The same error, naming the user's line."""
        return LoweringError(self.op, self.node, self.inputs, self.cause, user_frame)


class DuplicateLoweringError(CstorchError, RuntimeError):
    """Two lowerings were registered for the same ATen overload."""


class CaptureError(JaxBackendError):
    """The step function could not be turned into a graph."""


class ValueReadInTraceError(CstorchError, RuntimeError):
    """A traced step tried to read a tensor's value (``.item()``, ``print``, ``if tensor:``)."""

    def __init__(self, what: str, user_frame: str | None = None):
        self.what = what
        self.user_frame = user_frame
        where = f"\n{user_frame}" if user_frame else ""
        super().__init__(
            f"{what} inside a traced step: tensors in a compiled step have no value until the "
            f"step has run.{where}\n"
            "Move code that needs a value (printing, logging, `.item()`, Python `if` on a "
            "tensor) into a function decorated with `@cstorch.step_closure` and call it from "
            "the step with the tensor as an argument; use `torch.where` for conditions."
        )


class RecompilationError(CstorchError, RuntimeError):
    """A step would need a new graph on a backend that cannot recompile."""


class StepFailedError(JaxBackendError):
    """A compiled step failed while it ran; the message says what became of the state."""


def interrupt_behind(error: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C a ``SystemError`` stands for, or None.

    When the interrupt lands in Python code that C code called (a property numpy reads, a
    callback), some C code reports "... returned a result with an exception set", a
    SystemError whose cause is the KeyboardInterrupt. A step's entry points re-raise that
    interrupt (``raise interrupt from None``), so the user's ``except KeyboardInterrupt`` runs."""
    seen, current = 0, error  # type: int, BaseException | None
    while isinstance(current, SystemError) and seen < 8:
        current, seen = current.__cause__ or current.__context__, seen + 1
        if isinstance(current, KeyboardInterrupt):
            return current
    return None


def raise_interrupt_behind(error: BaseException) -> None:
    """Raises the Ctrl-C ``error`` stands for (``interrupt_behind``), if it does. The
    SystemError stays the interrupt's context, but without its traceback and its links back
    to the interrupt: a cycle of exceptions lives until the garbage collector runs, and with
    it every frame of the interrupt's traceback (the step's tensors, the user's locals)."""
    interrupt = interrupt_behind(error)
    if interrupt is None:
        return
    error.with_traceback(None)
    error.__cause__ = error.__context__ = None
    try:
        raise interrupt from None
    finally:  # nor a cycle through this frame
        del interrupt, error


def quoted(value, limit: int = 60) -> str:
    """``repr`` of a value from an untrusted file (a checkpoint, an export's manifest, a
    config), kept to about ``limit`` characters, so a message quoting it stays short whatever
    the file holds: ``'abcabc...' (50000000 characters)``; lists and dicts are abbreviated as
    ``reprlib`` does."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value)} characters)"
    short = reprlib.Repr()
    short.maxstring = short.maxother = limit
    short.maxlevel, short.maxlist, short.maxdict = 3, 6, 6
    text = short.repr(value)
    return text if len(text) <= 2 * limit else text[: 2 * limit] + "..."
