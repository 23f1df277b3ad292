"""Programs: a captured step compiled with ``jax.jit``.

A ``Program`` is the pure function ``(state, inputs, seed) -> (new_state, outputs)`` of one
captured step, jitted with the buffers of the state it overwrites donated. ``seed`` (an int64
scalar) feeds the PRNG key of the step's random ops. It also exposes the pure function, its
jaxpr, the StableHLO text and XLA's cost analysis.

``Program.run`` is one step as a transaction on a ``DeviceState``: the new state is recorded
only if the step ran; Ctrl-C is held back while state is donated; the first run keeps a
backup of the state it donates (``backup_first_run``), later runs keep no second copy. The
rules and their costs are in docs/ARCHITECTURE.md (section 4, "Faults").
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import signal
import threading
import warnings
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_backend import (
    cbfloat16,
    config,
    host_memory,
    jax_settings,
    native_embedding,
    native_layer_norm,
    native_loss,
    native_optimizer,
    target,
)
from jax_backend.capture import CapturedStep
from jax_backend.dtypes import to_jax_dtype
from jax_backend.errors import LoweringError, StepFailedError, raise_interrupt_behind
from jax_backend.interpreter import GraphInterpreter
from jax_backend.jax_settings import in_engine_scope
from jax_backend.mesh import Layout
from jax_backend.ops import attention, layout_copy, torch_kernels
from jax_backend.precision import Policy
from jax_backend.registry import lookup
from jax_backend.scalars import ScalarMeta

#: The ops with native float32 CPU lowerings of the engine's own (``Target.native_ops``), by
#: the name the target lists them under: each module's ``wanted`` says whether a program uses
#: it (its setting, the platform, the library).
NATIVE_OPS = {"layer_norm": native_layer_norm, "embedding": native_embedding, "loss": native_loss}


@contextlib.contextmanager
def interrupts_held():
    """Delays SIGINT (KeyboardInterrupt) until the block ends. Only the main thread receives
    signals in Python; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(frame))
    if previous is None:  # a handler installed outside Python: hand the signal to the default
        previous = signal.SIG_DFL
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received and callable(previous):
            previous(signal.SIGINT, received[0])
        elif received and previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)


def _has_random_nodes(graph) -> bool:
    return any(
        node.op == "call_function"
        and node.target is not operator.getitem
        and lookup(node.target).random
        for node in graph.graph.nodes
    )


class Program:
    """One compiled step. Call it with arrays; it returns arrays (dispatch is asynchronous)."""

    @property
    def backup_first_run(self) -> bool:  # see the module docstring
        return config.backup_first_run.value

    def __init__(
        self,
        captured: CapturedStep,
        policy: Policy | None = None,
        layout: Layout | None = None,
        platform: str | None = None,
    ):
        self.captured = captured
        self.policy = policy or Policy()
        self.layout = layout
        # What the lowerings target (``jax_backend.target``): the platform the program runs
        # on (default: that of the layout's devices, else JAX's default device).
        if platform is None:
            device = layout.mesh.devices.flat[0] if layout is not None else jax.devices()[0]
            platform = target.platform_of(device)
        self.target = target.Target(
            platform, self.policy.float32_matmul, target.attention_setting()
        )
        self.uses_rng = _has_random_nodes(captured.graph)
        written = set(captured.written_state)
        # Positions (within used_state) of state the step overwrites: their buffers are donated.
        self.donated_positions = [j for j, i in enumerate(captured.used_state) if i in written]
        self.kept_positions = [j for j, i in enumerate(captured.used_state) if i not in written]
        self._interpreter = GraphInterpreter(
            captured.graph, emulation=cbfloat16.interpreter_emulation(self.policy)
        )
        self._locate = captured.locate  # names the user's line in a LoweringError
        self._jitted = self._jit()
        self.has_run = False  # set after the first successful run (see module docstring)

    def _jit(self):
        """``jax.jit`` of the step for the current target. The function is new each time: jit
        keys its trace cache by the function, and bound methods of one program compare equal,
        so after a change of target (the cuDNN fallback) JAX 0.7 reused the old trace."""
        # torch's CPU kernels for the convolutions and bfloat16 weight-gradient dots
        # (cpu_convolutions, cpu_half_dots), in this program only: never in an export or
        # pure_function (ops/torch_kernels.py).
        kernels = torch_kernels.wanted(self.target.platform, self.layout)
        native = torch_kernels.called_natively(kernels)  # without a host callback
        # The engine's native layout copy for its CPU half dots (cpu_half_dots), likewise.
        copies = layout_copy.wanted(self.target.platform, self.layout)
        # The Adam family's and SGD's updates as one native call (cpu_optimizer), likewise.
        fused_update = native_optimizer.wanted(self.target.platform, self.layout)
        # Float32 layer norms, embeddings and losses as native calls (cpu_layer_norm,
        # cpu_embedding, cpu_loss), likewise.
        native_ops = frozenset(
            name
            for name, module in NATIVE_OPS.items()
            if module.wanted(self.target.platform, self.layout)
        )

        def pure_step(donated, kept, inputs, seed):  # jit names the program after it
            return self.pure_step(
                donated,
                kept,
                inputs,
                seed,
                torch_kernels=kernels,
                native_kernels=native,
                layout_copies=copies,
                native_update=fused_update,
                native_ops=native_ops,
            )

        self._compiled_ahead = False  # see _call_jitted
        # How a CPU step's working memory is laid out (cpu_step_memory); nothing elsewhere.
        options = host_memory.step_compiler_options(self.target.platform)
        self._pooled = host_memory.pooled(self.target.platform)
        self._cache_writes = (
            contextlib.nullcontext
            if host_memory.cacheable(options)
            else jax_settings.no_cache_writes
        )
        return jax.jit(
            pure_step, donate_argnums=(0,), compiler_options=options or None, **self._shardings()
        )

    def _shardings(self) -> dict:
        """jit shardings for a mesh layout: state as the layout places it, inputs split along
        the batch dimension; user outputs are left to XLA."""
        if self.layout is None:
            return {}
        placeholders = [n for n in self.captured.graph.graph.nodes if n.op == "placeholder"]
        used = placeholders[: len(self.captured.used_state)]
        state = [self.layout.state_sharding(n.meta["val"].shape) for n in used]
        inputs = [
            self.layout.replicated()
            if isinstance(n.meta["val"], ScalarMeta)
            else self.layout.input_sharding(n.meta["val"].shape)
            for n in placeholders[len(used) :]
        ]
        outputs = next(n for n in self.captured.graph.graph.nodes if n.op == "output").args[0]
        written = [
            self.layout.state_sharding(o.meta["val"].shape)
            for o in outputs[: len(self.captured.written_state)]
        ]
        in_shardings = (
            [state[j] for j in self.donated_positions],
            [state[j] for j in self.kept_positions],
            inputs,
            self.layout.replicated(),
        )
        return {"in_shardings": in_shardings, "out_shardings": (written, None)}

    def pure_step(
        self,
        donated,
        kept,
        inputs,
        seed,
        *,
        platform=None,
        torch_kernels=frozenset(),
        native_kernels=frozenset(),
        layout_copies=False,
        native_update=False,
        native_ops=frozenset(),
    ):
        """The step as a pure JAX function (not jitted); ``platform`` overrides the one it is
        lowered for (an export for several platforms passes "any"); ``torch_kernels``: the
        kinds of op whose CPU lowering calls torch's kernels, ``native_kernels``: those of
        them called through the engine's FFI library instead of a host callback,
        ``layout_copies``: whether half dots may use the native layout copy, ``native_update``:
        whether the Adam family's and SGD's updates may run natively, ``native_ops``: the ops
        whose float32 lowerings may call the engine's own kernels (the engine's own program;
        ``ops.torch_kernels.wanted``/``called_natively``, ``ops.layout_copy.wanted``,
        ``native_optimizer.wanted``, ``NATIVE_OPS``)."""
        used = [None] * (len(donated) + len(kept))
        for j, a in zip(self.donated_positions, donated):
            used[j] = a
        for j, a in zip(self.kept_positions, kept):
            used[j] = a
        key = jax.random.key(seed) if self.uses_rng else None
        lowering = dataclasses.replace(
            self.target,
            platform=platform or self.target.platform,
            torch_kernels=torch_kernels,
            native_kernels=native_kernels,
            layout_copies=layout_copies,
            native_optimizer=native_update,
            native_ops=native_ops,
        )
        with target.lowering_for(lowering):
            flat = self._interpreter.run(list(used) + list(inputs), key)
        n = len(self.captured.written_state)
        return list(flat[:n]), list(flat[n:])

    def split_state(self, used_arrays: Sequence):
        return (
            [used_arrays[j] for j in self.donated_positions],
            [used_arrays[j] for j in self.kept_positions],
        )

    @in_engine_scope
    def __call__(self, used_arrays: Sequence, inputs: Sequence, seed=0):
        donated, kept = self.split_state(used_arrays)
        if self.layout is not None:  # across processes: each feeds its slice of the batch
            inputs = [x if isinstance(x, float) else self.layout.input_array(x) for x in inputs]
        args = (donated, kept, list(inputs), np.int64(seed))
        with self._naming_user_line():
            try:
                return self._call_jitted(args)
            except Exception as error:  # re-raised unless cuDNN was the cause
                if not self._without_cudnn_after(error, donated):
                    raise
            return self._call_jitted(args)

    def _call_jitted(self, args):
        """The jitted step on ``args``. The first call compiles it before running it (jit then
        reuses that executable: no second trace or compile), and gives the compiler's freed
        working memory back to the system in between: kept by the C heap, it would stay
        resident through the first run, whose peak it raised by ~110 MiB of ~860 on
        ``bench_engine``'s transformer."""
        if not self._compiled_ahead:
            with self._cache_writes(), torch_kernels.counting() as kernel_ops:
                compiled = self._jitted.lower(*args).compile()
            host_memory.trim()
            if self._pooled:
                host_memory.keep_step_memory(compiled, torch_kernels=kernel_ops[0] > 0)
            self._compiled_ahead = True
        return self._jitted(*args)

    def _without_cudnn_after(self, error, donated) -> bool:
        """A program that uses cuDNN's fused attention and fails to compile because of it
        (before it ran: nothing was donated) is rebuilt with XLA's attention, with a warning,
        rather than stopping training; True if so."""
        text = f"{type(error).__name__}: {error}".lower()
        if (
            self.has_run
            or self.target.attention == "xla"
            or self.target.platform != "cuda"
            or not ("cudnn" in text or "dot_product_attention" in text)
            or any(getattr(a, "is_deleted", lambda: False)() for a in donated)
        ):
            return False
        warnings.warn(
            f"The step's cuDNN attention failed to compile ({_first_line(error)}); "
            "it is compiled again with XLA's attention (set CSTORCH_ATTENTION=xla "
            "to skip the attempt).",
            attention.AttentionFallbackWarning,
            stacklevel=4,
        )
        self.target = dataclasses.replace(self.target, attention="xla")
        self._jitted = self._jit()
        return True

    @contextlib.contextmanager
    def _naming_user_line(self):
        """Adds the user's line to a ``LoweringError`` raised while jit traces the step."""
        try:
            yield
        except LoweringError as err:
            if err.user_frame is not None or self._locate is None:
                raise
            raise err.with_user_frame(self._locate(err.op)) from err.cause

    def run(self, state, used: Sequence, written: Sequence, inputs: Sequence, seed=0):
        """Runs one step on ``state`` (a ``DeviceState``): ``used`` are the torch tensors the
        step reads, ``written`` those it overwrites (in the program's output order). Returns
        the step's outputs; raises ``StepFailedError`` if it failed (module docstring)."""
        arrays = state.arrays(used)
        donated_tensors, kept_tensors = self.split_state(list(used))
        donated_arrays, _ = self.split_state(arrays)
        backed_up = (
            not self.has_run and self.backup_first_run and state.hold_in_torch(donated_tensors)
        )
        with interrupts_held():
            # Any torch copy that is not the backup goes before the run, not after: a copy
            # kept through the run (e.g. one filled by a checkpoint) would double its peak.
            state.release_torch_copies(kept_tensors if backed_up else used)
            try:
                new_state, outputs = self(arrays, inputs, seed)
                if backed_up:
                    jax.block_until_ready((new_state, outputs))
            except BaseException as error:  # (no other name may keep it: it holds the frames)
                if not any(a.is_deleted() for a in donated_arrays):
                    raise_interrupt_behind(error)
                    raise  # it failed before running (e.g. while compiling): state untouched
                what = state.recover(donated_tensors, donated_arrays, backed_up)
                raise_interrupt_behind(error)
                if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit
                    raise
                raise StepFailedError(
                    f"The compiled step failed while it ran ({type(error).__name__}: "
                    f"{_first_line(error)}). {what} Fix the cause (e.g. a smaller batch) and "
                    "call the step again, or save the state from here."
                ) from error
            state.update(written, new_state)
        self.has_run = True
        # Lowered once, it lowers again: the locator (which holds the step's state containers,
        # and with them any state a load_state_dict has since replaced) is no longer needed.
        self._locate = self.captured.locate = None
        return outputs

    # ------------------------------------------------------------------ introspection
    @in_engine_scope
    def input_specs(self) -> list:
        """Shapes and dtypes of the step's (non-state) inputs, as ``jax.ShapeDtypeStruct``."""
        return self._placeholder_specs()[len(self.captured.used_state) :]

    @in_engine_scope
    def state_specs(self) -> list:
        """Shapes and dtypes of the state the step reads (``used_state``), in its order."""
        return self._placeholder_specs()[: len(self.captured.used_state)]

    def _placeholder_specs(self) -> list:
        placeholders = [n for n in self.captured.graph.graph.nodes if n.op == "placeholder"]
        return [
            _scalar_spec(n.meta["val"])
            if isinstance(n.meta["val"], ScalarMeta)
            else jax.ShapeDtypeStruct(tuple(n.meta["val"].shape), to_jax_dtype(n.meta["val"].dtype))
            for n in placeholders
        ]

    @in_engine_scope
    def lower(self, used_arrays: Sequence, inputs: Sequence, seed=0):
        donated, kept = self.split_state(used_arrays)
        with self._naming_user_line():
            return self._jitted.lower(donated, kept, list(inputs), np.int64(seed))

    @in_engine_scope
    def jaxpr(self, used_arrays: Sequence, inputs: Sequence, seed=0):
        donated, kept = self.split_state(used_arrays)
        with self._naming_user_line():
            return jax.make_jaxpr(self.pure_step)(donated, kept, list(inputs), np.int64(seed))

    def stablehlo(self, used_arrays: Sequence, inputs: Sequence, seed=0) -> str:
        return self.lower(used_arrays, inputs, seed).as_text()

    @in_engine_scope
    def cost_analysis(self, used_arrays: Sequence, inputs: Sequence, seed=0):
        with self._cache_writes():
            return self.lower(used_arrays, inputs, seed).compile().cost_analysis()


def _scalar_spec(meta: ScalarMeta) -> jax.ShapeDtypeStruct:
    """A runtime scalar input (``jax_backend.scalars``): what ``jax.jit`` makes of a Python
    number argument, a weakly typed scalar (64-bit in the engine's settings)."""
    dtype = {"float": jnp.float64, "int": jnp.int64, "bool": jnp.bool_}[meta.kind]
    return jax.ShapeDtypeStruct((), dtype, weak_type=True)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"
