"""The engine's settings: every environment variable and process-wide knob, declared once.

A ``Setting`` has a name, the environment variable that sets it (if any), a default and a
help text, as JAX declares its own config. A value is read when it is used: the value given
to ``config.update(name, value)`` if there is one, else the environment variable, else the
default. ``config.reset()`` forgets every ``update`` and runs the reset hooks of modules that
keep process-wide state (tests call it between tests instead of editing private globals).
``config.describe()`` lists every setting; ``cstorch.config`` declares the API's own.

**The graph cache's key** (``jax_backend/graph_cache/key.py``) takes every process-wide value
a trace can read that the step's objects do not hold, and each declares itself where it is
defined, as JAX's ``include_in_jit_key`` does: a setting with ``include_in_graph_key=True``,
and a module's own state with ``config.include_in_graph_key(name, read)`` beside it (the
``cstorch.backends`` flags, the half dtype, ...). Each is one named part of the key
(``graph_key_values``), so a miss can say which one changed. A setting that only changes how
a captured graph is compiled or run (``attention``, ``cpu_step_memory``) does not declare it.

Each setting is checked where it is declared: ``check`` (a type and range, or ``choices``)
validates a value given to ``update`` when it is given, and a value from the environment
(after ``parse``) when it is read, so a wrong value is refused before any step runs, with one
message that names the setting, the value, where it came from and what it must be
(``SettingError``).

Nothing here changes anything outside the engine: JAX's own config, the environment and
torch are left as the user set them (docs/ARCHITECTURE.md, "A good citizen").
"""

from __future__ import annotations

import dataclasses
import math
import os
import weakref
from typing import Any, Callable

from jax_backend.errors import CstorchError, CstorchTypeError, CstorchValueError, quoted

_OFF = {"", "0", "off", "false", "no"}
_ON = {"1", "on", "true", "yes"}


class SettingError(CstorchError, ValueError):
    """A setting was given a value it cannot take (from ``update`` or the environment)."""


# -------------------------------------------------------------------- checks of a value
# Each takes a Python value and returns it (normalised), or raises TypeError/ValueError
# with what the value must be; ``Setting`` turns that into a SettingError naming the setting.
def boolean(value) -> bool:
    if not isinstance(value, bool):
        raise CstorchTypeError("must be True or False")
    return value


def _not_a_string(value) -> str:
    return " (a number, not a string)" if isinstance(value, str) else ""


def positive_int(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CstorchValueError(f"must be a positive integer{_not_a_string(value)}")
    return value


def non_negative_int(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CstorchValueError(f"must be an integer >= 0{_not_a_string(value)}")
    return value


def non_negative_number(value) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or value < 0
    ):
        raise CstorchValueError(f"must be a number >= 0{_not_a_string(value)}")
    return value


def text(value) -> str:
    if not isinstance(value, str):
        raise CstorchTypeError("must be a string")
    return value


def path(value) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise CstorchTypeError("must be a path (a str or os.PathLike)")
    return os.path.expanduser(os.fspath(value))


def cache_location(value) -> str | None:
    """A cache's place: a directory, ``"default"`` or None (off); a string is read as the
    environment variable's text is (``on``, ``off``, a path)."""
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise CstorchTypeError('must be a directory, "default" (on) or None (off)')
    return parse_directory(value)


def optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``check``, or None (the setting's "not set")."""

    def check_optional(value):
        return None if value is None else check(value)

    check_optional.__name__ = f"optional_{check.__name__}"
    return check_optional


def parse_bool(text: str) -> bool:
    return text.strip().lower() not in _OFF


def parse_word(text: str) -> str:
    """One of a setting's ``choices``, as written in any case, spaces around it dropped."""
    return text.strip().lower()


def parse_directory(text: str) -> str | None:
    """A directory (``~`` expanded), ``"default"`` for ``on`` (also ``1``, ``true``, ``yes``),
    or None for ``off`` (also ``0``, ``false``, ``no``, empty)."""
    word = text.strip().lower()
    if word in _OFF:
        return None
    return "default" if word in _ON else os.path.expanduser(text)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting. ``value`` is read afresh each time (see the module docstring).

    ``parse`` turns the environment variable's text into a value; ``check`` validates (and
    may normalise) a value, whether given to ``update`` or parsed from the environment;
    ``choices``: the words the setting takes (strings are compared stripped and lower-cased);
    ``include_in_graph_key``: whether a step traced under another value may capture another
    graph (its value is then a part of the graph cache's key, as JAX's ``include_in_jit_key``)."""

    name: str
    default: Any
    help: str
    env_var: str | None = None
    parse: Callable[[str], Any] = str
    check: Callable[[Any], Any] | None = None
    choices: tuple | None = None
    include_in_graph_key: bool = False
    owner: "Config" = dataclasses.field(
        default=None,
        repr=False,  # type: ignore[assignment]
        compare=False,
    )  # (set by Config.define)

    @property
    def value(self):
        return self.owner.value(self)

    def checked(self, value, source: str, given=None):
        """``value`` validated (and normalised) for this setting; ``source`` says where it came
        from and ``given`` what it said (the environment's text), for the message. Raises
        SettingError."""
        try:
            if self.choices is not None and value is not None:
                word = value.strip().lower() if isinstance(value, str) else value
                if word not in self.choices:
                    raise CstorchValueError(f"must be one of {', '.join(map(str, self.choices))}")
                value = word
            return value if self.check is None else self.check(value)
        except (TypeError, ValueError) as error:
            raise self._invalid(value if given is None else given, source, error) from None

    def _invalid(self, value, source: str, reason) -> SettingError:
        """The one form of the message: the setting, the value, its source and the rule."""
        return SettingError(
            f"Invalid {self.owner.layer} setting {self.name}={quoted(value)} "
            f"(from {source}): {reason}. "
            f"{self.help.split('. ')[0].rstrip('.')}."
        )

    def from_environment(self, environ=None):
        """The value the environment (``os.environ`` or ``environ``) asks for, else the default;
        ``update`` is not consulted (for code that reads a child process's environment)."""
        environ = os.environ if environ is None else environ
        text = environ.get(self.env_var) if self.env_var else None
        if text is None:
            return self.default
        source = f"the environment variable {self.env_var}"
        try:
            value = self.parse(text)
        except (TypeError, ValueError) as error:
            raise self._invalid(text, source, error) from None
        return self.checked(value, source, given=text)


_layers: list = []  # weak references to every Config, in the order they were made


def layers() -> list:
    """Every layer's ``Config`` (the engine's first), for code that reads them all."""
    return [layer for layer in (ref() for ref in _layers) if layer is not None]


class Config:
    """A layer's settings (``jax_backend.config.config``, ``cstorch.config.config``)."""

    def __init__(self, layer: str):
        self.layer = layer
        self._settings: dict[str, Setting] = {}
        self._overrides: dict[str, Any] = {}
        self._reset_hooks: list[Callable[[], None]] = []
        self._graph_key_reads: dict[str, Callable[[], Any]] = {}
        _layers.append(weakref.ref(self))

    def define(
        self,
        name: str,
        default,
        help: str,
        env_var: str | None = None,
        parse: Callable[[str], Any] = str,
        check: Callable[[Any], Any] | None = None,
        choices: tuple | None = None,
        include_in_graph_key: bool = False,
    ) -> Setting:
        if name in self._settings:
            raise CstorchValueError(f"{self.layer} setting {name!r} is declared twice.")
        setting = Setting(
            name, default, help, env_var, parse, check, choices, include_in_graph_key, self
        )
        setting.checked(default, "its default")  # (a declaration mistake fails at import)
        self._settings[name] = setting
        return setting

    def __getitem__(self, name: str) -> Setting:
        try:
            return self._settings[name]
        except KeyError:
            raise KeyError(
                f"{self.layer} has no setting {name!r}; its settings are "
                f"{', '.join(sorted(self._settings))}."
            ) from None

    def value(self, setting: Setting | str):
        setting = self[setting] if isinstance(setting, str) else setting
        if setting.name in self._overrides:
            return self._overrides[setting.name]
        return setting.from_environment()

    def update(self, name: str, value) -> None:
        """Sets ``name`` for this process; it wins over the environment until ``reset``. A
        value the setting cannot take raises SettingError now, before it is used."""
        self._overrides[name] = self[name].checked(value, "config.update")

    def on_reset(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Registers ``hook()`` to run on ``reset`` (a module's process-wide state)."""
        self._reset_hooks.append(hook)
        return hook

    def reset(self) -> None:
        """Every setting back to its environment/default; every registered hook run."""
        self._overrides.clear()
        for hook in list(self._reset_hooks):
            hook()

    def include_in_graph_key(self, name: str, read: Callable[[], Any]) -> Callable[[], Any]:
        """Declares process-wide state a traced step can read that no setting holds (a
        module's flags, a mode): ``read()`` (plain data or objects the graph cache's
        fingerprint can describe) is the part ``name`` of the graph cache's key, read each
        time a key is taken. Declaring the same ``read`` again under its name is a no-op."""
        if self._graph_key_reads.get(name, read) is not read:
            raise CstorchValueError(f"{self.layer}: {name!r} is declared twice for the graph key.")
        self._graph_key_reads[name] = read
        return read

    def graph_key_values(self) -> list:
        """``[(part name, value)]``: what this layer puts in the graph cache's key, read now:
        its settings declared ``include_in_graph_key`` (``setting <layer>.<name>``) and the
        values modules declared with ``include_in_graph_key``, by name (not by the order
        the modules were imported in)."""
        values = [
            (f"setting {self.layer}.{s.name}", s.value)
            for s in self._settings.values()
            if s.include_in_graph_key
        ]
        values += [(name, read()) for name, read in self._graph_key_reads.items()]
        return sorted(values, key=lambda item: item[0])

    def describe(self) -> list[Setting]:
        return list(self._settings.values())


config = Config("jax_backend")

cache_home = config.define(
    "cache_home",
    None,
    "The base directory of the persistent caches (the XDG standard): "
    "caches live in <cache_home>/cstorch-jax/. Default ~/.cache.",
    env_var="XDG_CACHE_HOME",
    parse=os.path.expanduser,
    check=optional(path),
)
compilation_cache = config.define(
    "compilation_cache",
    "default",
    "Where XLA executables of the engine's programs are cached "
    "(jax_backend/compilation_cache.py): a directory, or off. Default "
    "<cache_home>/cstorch-jax/xla.",
    env_var="CSTORCH_COMPILATION_CACHE",
    parse=parse_directory,
    check=cache_location,
)
graph_cache = config.define(
    "graph_cache",
    None,
    "Where captured step graphs are cached (jax_backend/graph_cache/): "
    "a directory, on (<cache_home>/cstorch-jax/graphs) or off. Off by default: see the "
    "README for what the key covers.",
    env_var="CSTORCH_GRAPH_CACHE",
    parse=parse_directory,
    check=cache_location,
)
graph_cache_explain = config.define(
    "graph_cache_explain",
    False,
    "Whether the graph cache says, as a warning of the "
    "jax_backend.graph_cache logger, why a step is captured again (which parts of its key "
    "differ from the step's stored entries, or which file changed) or why it is not cached; "
    "off, the same lines are debug messages. Not part of any key.",
    env_var="CSTORCH_GRAPH_CACHE_EXPLAIN",
    parse=parse_bool,
    check=boolean,
)
attention = config.define(
    "attention",
    "auto",
    "Which attention kernel a step's lowering may use "
    "(jax_backend/target.py: Target.attention, one of its ATTENTION names).",
    env_var="CSTORCH_ATTENTION",
    parse=lambda text: text.strip().lower() or "auto",
    choices=("auto", "xla", "cudnn"),
)
backup_first_run = config.define(
    "backup_first_run",
    True,
    "Whether the first run of a program keeps the state it donates "
    "until it succeeded (jax_backend/program.py); False trades that protection for a "
    "first-step memory peak like any other step's.",
    check=boolean,
)
cpu_step_memory = config.define(
    "cpu_step_memory",
    "auto",
    "How a CPU step's working memory is laid out "
    "(jax_backend/host_memory.py, STEP_MEMORY): auto (default: pool where it can run, for "
    "steps whose kept blocks total at most 1 GiB, else lean), lean (XLA's memory-optimized schedule, "
    "12-14% less working memory than XLA's own default at the same speed here), xla (XLA's "
    "default), or reuse (heaps malloc keeps between runs: on 2 cores, bench_engine's "
    "transformer steps 8% faster and GPT-2 small's 1.5%, for a third to a half more of the "
    "workload's own memory, more with more cores), or pool (lean, with the working memory kept "
    "between runs by the engine's own pool, jax_backend/step_pool.py: Linux and glibc, built "
    "by make; bench_engine's transformer step 1.56x -> 1.15x eager, its CNN 1.52x -> 1.06x, "
    "for one more working-memory block at the peak; a step calling torch's convolution kernels "
    "also has the blocks those allocate kept, 256 MiB at most). Read when a program is built.",
    env_var="CSTORCH_CPU_STEP_MEMORY",
    parse=parse_word,
    choices=("lean", "xla", "reuse", "pool", "auto"),
)
cpu_convolutions = config.define(
    "cpu_convolutions",
    "native",
    "Which kernels the convolutions of a CPU step run on "
    "(jax_backend/ops/torch_kernels.py): native (default: torch's own CPU kernels, called "
    "from the compiled step through the engine's FFI library, jax_backend/native/"
    "torch_convolutions.cc: eager torch's numbers, and on pytorch/examples' MNIST network a "
    "step several times faster than XLA's; where the library is not built for this jaxlib "
    "and torch, as torch), torch (the same kernels through host callbacks, ~2 ms more a call; "
    "such a step is never written to the persistent compilation cache) or xla (XLA's "
    "convolutions). One CPU device only; exports and other platforms always use XLA's. Read "
    "when a program is built.",
    env_var="CSTORCH_CPU_CONVOLUTIONS",
    parse=parse_word,
    choices=("native", "torch", "xla"),
)
cpu_half_dots = config.define(
    "cpu_half_dots",
    "native",
    "How a CPU step runs the bfloat16 matrix products XLA's fast kernels refuse, those that "
    "contract the leading dimension of their left operand (the weight gradients of every "
    "linear layer, x^T.dy, and the attention's products): native (default: the engine's own "
    "layout copy, jax_backend/ops/layout_copy.py, gives XLA's bfloat16 kernels the operand "
    "transposed, and attention's query, key and value row-major; where its library is not "
    "built for this jaxlib, as torch), "
    "torch (the weight gradients on torch's own bfloat16 GEMM, called from the compiled step "
    "on the host, the kernel eager autocast runs; such a step is never written to the "
    "persistent compilation cache) or xla (XLA widens them to float32: about twice the "
    "time). One CPU device only; exports and other platforms always use XLA's. Read when a "
    "program is built.",
    env_var="CSTORCH_CPU_HALF_DOTS",
    parse=parse_word,
    choices=("native", "torch", "xla"),
)
cpu_optimizer = config.define(
    "cpu_optimizer",
    "native",
    "How a CPU step runs the update of cstorch's Adam, AdamW and SGD "
    "(jax_backend/native_optimizer.py): native (default: a param group's whole update in one "
    "call of the engine's FFI library, jax_backend/native/fused_optimizer.cc, each float "
    "operation rounded on its own, where XLA's kernels fuse some multiply-adds; where the "
    "library is not built for this jaxlib, as xla) or xla (XLA's kernels: one per new array "
    "per distinct parameter shape, each compiled on the step's first run). float32 parameters "
    "and state only, one CPU device only; exports, pure_function and other platforms always "
    "use XLA's. Read when a program is built.",
    env_var="CSTORCH_CPU_OPTIMIZER",
    parse=parse_word,
    choices=("native", "xla"),
)
cpu_layer_norm = config.define(
    "cpu_layer_norm",
    "native",
    "How a CPU step runs float32 layer norms and their backward "
    "(jax_backend/native_layer_norm.py): native (default: each as one call of the engine's FFI "
    "library, jax_backend/native/layer_norm.cc, a row's statistics and results in one pass; "
    "where the library is not built for this jaxlib, as xla) or xla (XLA's kernels: a "
    "reduction per statistic and a kernel per result, each compiled on the step's first run). "
    "One CPU device only; exports, pure_function, half-precision inputs and other platforms "
    "always use XLA's. Read when a program is built.",
    env_var="CSTORCH_CPU_LAYER_NORM",
    parse=parse_word,
    choices=("native", "xla"),
)
cpu_embedding = config.define(
    "cpu_embedding",
    "native",
    "How a CPU step runs the gather of a float32 embedding and its gradient's scatter-add "
    "(jax_backend/native_embedding.py): native (default: each as one call of the engine's FFI "
    "library, jax_backend/native/embedding.cc; where the library is not built for this "
    "jaxlib, as xla) or xla (XLA's gather and scatter with their bounds checks: several "
    "kernels, each compiled on the step's first run). One CPU device only; exports, "
    "pure_function, other dtypes and other platforms always use XLA's. Read when a program "
    "is built.",
    env_var="CSTORCH_CPU_EMBEDDING",
    parse=parse_word,
    choices=("native", "xla"),
)
cpu_loss = config.define(
    "cpu_loss",
    "native",
    "How a CPU step runs float32 log-softmax over the last dim and the negative "
    "log-likelihood with a mean or sum, forward and backward: cross_entropy's parts "
    "(jax_backend/native_loss.py): native (default: each as one call of the engine's FFI "
    "library, jax_backend/native/loss.cc, a row at a time; where the library is not built for "
    "this jaxlib, as xla) or xla (XLA's kernels: about ten, each compiled on the step's first "
    "run). One CPU device only; exports, pure_function, other dims, dtypes and reductions and "
    "other platforms always use XLA's. Read when a program is built.",
    env_var="CSTORCH_CPU_LOSS",
    parse=parse_word,
    choices=("native", "xla"),
)
debug_state = config.define(
    "debug_state",
    False,
    "Whether each state tensor's entry in a DeviceState checks every "
    "change of its flags against the table of legal transitions (jax_backend/state.py, "
    "TRANSITIONS) and raises IllegalTransition on any other; read when a backend's state is "
    "created. Off by default (for tests and debugging).",
    env_var="CSTORCH_DEBUG_STATE",
    parse=parse_bool,
    check=boolean,
)


def cache_directory(setting: Setting, name: str) -> str | None:
    """The directory a cache ``setting`` asks for (None when it says ``off``); its default is
    ``name`` under ``<cache_home>/cstorch-jax``."""
    value = setting.value
    if value is None or value != "default":
        return value
    base = cache_home.value or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cstorch-jax", name)
