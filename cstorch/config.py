"""cstorch's settings: every environment variable and process-wide knob of the API, declared
once (the engine's own are in ``jax_backend.config``; the compatibility packages read these).

Each setting has a name, an environment variable (if any), a default and a help text; its
value is read when it is used (``config.update`` wins over the environment until
``reset``). ``reset()`` puts the whole process back as it was before any backend: it tears
the backend down, restores the precision defaults, forgets metrics and every ``update``, in
both layers, and runs the hooks other modules registered with ``config.on_reset`` (the 1.x
API's ``configure`` settings, for one). Tests call it between tests; scripts have no need to.

Importing cstorch sets nothing outside it. ``OMP_WAIT_POLICY`` in particular is left to the
user (docs/ARCHITECTURE.md): the launchers that start new processes
(``python -m cstorch.distributed.launch``, ``python -m cstorch.parity``) pass
``LAUNCHED_PROCESS_ENV`` to them unless the environment sets those variables already.
"""

from __future__ import annotations

from jax_backend import config as _engine_config
from jax_backend.config import (
    Config,
    SettingError as SettingError,
    boolean,
    non_negative_int,
    non_negative_number,
    optional,
    parse_bool,
    path,
    positive_int,
    text,
)
from jax_backend.errors import CstorchValueError

config = Config("cstorch")


def named_check(check):
    """One of ``jax_backend.config``'s value checks (``positive_int``, ...) as
    ``validate(name, value)`` for a field checked where it is declared outside a setting (a
    ``cstorch.backends`` flag, a ``DistributedConfig`` field): a ValueError naming the field
    and the value given."""

    def validate(name: str, value):
        try:
            return check(value)
        except (TypeError, ValueError) as error:
            raise CstorchValueError(f"{name} {error}, got {value!r}.") from None

    return validate


def _integer(text: str) -> int | None:
    """An environment variable's integer; empty is unset (None), as the launchers read it."""
    if not text.strip():
        return None
    if not text.strip().lstrip("+-").isdigit():
        raise CstorchValueError("must be an integer")
    return int(text)


engine = config.define(
    "engine",
    "jax",
    "Which engine runs traced steps when the backend does not say: jax "
    "(compile once) or eager (eager torch every step; cstorch/core/engine.py).",
    env_var="CSTORCH_ENGINE",
    parse=lambda text: text.strip().lower() or "jax",
    choices=("jax", "eager"),
)
serve_backend = config.define(
    "serve_backend",
    None,
    "For tools that run a script unchanged on another backend (python "
    "-m cstorch.parity): cpu, gpu or csx, the type of backend that serves every "
    "cstorch.backend(...) of the process, whatever type the script names. Of the script's "
    "backend arguments only artifact_dir is kept; the engine comes from the engine setting.",
    choices=("cpu", "gpu", "csx"),
)
progress = config.define(
    "progress",
    "auto",
    "How runs show progress (cstorch/utils/progress.py): auto (a bar on a "
    "terminal, plain lines elsewhere, for runs of at least progress_bar_min_steps steps), bar, "
    "lines or off.",
    env_var="CSTORCH_PROGRESS",
    parse=lambda text: text.strip().lower(),
    choices=("auto", "bar", "lines", "off"),
)
progress_bar = config.define(
    "progress_bar",
    None,
    "The older switch: 1 is progress=bar, 0 is progress=off (used when progress is auto).",
    env_var="CSTORCH_PROGRESS_BAR",
    parse=parse_bool,
    check=optional(boolean),
)
progress_bar_min_steps = config.define(
    "progress_bar_min_steps",
    50,
    "The fewest steps of a run that shows progress in auto mode.",
    check=non_negative_int,
)
progress_every = config.define(
    "progress_every",
    None,
    "Steps between plain progress lines (default: a twentieth of the run).",
    env_var="CSTORCH_PROGRESS_EVERY",
    parse=_integer,
    check=optional(positive_int),
)
progress_seconds = config.define(
    "progress_seconds",
    30.0,
    "Seconds after which a plain progress line is printed even before progress_every steps.",
    env_var="CSTORCH_PROGRESS_SECONDS",
    parse=float,
    check=non_negative_number,
)
max_programs = config.define(
    "max_programs",
    16,
    "How many compiled programs one traced step keeps (least recently used "
    "are dropped, and compiled again if needed).",
    check=positive_int,
)
generating_docs = config.define(
    "generating_docs",
    False,
    "Set to 1 only while documentation is generated from the docstrings (as in the reference).",
    env_var="GENERATING_CEREBRAS_PYTORCH_DOCS",
    parse=lambda text: text == "1",
    check=boolean,
)
torch_num_threads = config.define(
    "torch_num_threads",
    None,
    "torch's thread count; the CSX backend checks that it is a "
    "positive integer, as the reference does.",
    env_var="TORCH_NUM_THREADS",
    parse=lambda text: _integer(text if text.strip() else "unset"),
    check=optional(positive_int),
)

# A multi-process job (cstorch/distributed/runtime.py); also read from a child's environment.
coordinator_address = config.define(
    "coordinator_address",
    None,
    "host:port of the job's coordinator (process 0).",
    env_var="CSTORCH_COORDINATOR_ADDRESS",
    check=optional(text),
)
num_processes = config.define(
    "num_processes",
    None,
    "The number of processes of the job.",
    env_var="CSTORCH_NUM_PROCESSES",
    parse=_integer,
    check=optional(positive_int),
)
process_id = config.define(
    "process_id",
    None,
    "This process's rank in the job (0-based).",
    env_var="CSTORCH_PROCESS_ID",
    parse=_integer,
    check=optional(non_negative_int),
)
init_timeout = config.define(
    "init_timeout",
    60,
    "Seconds to wait for every process to join before DistributedError.",
    env_var="CSTORCH_INIT_TIMEOUT",
    parse=_integer,
    check=optional(positive_int),
)
heartbeat_timeout = config.define(
    "heartbeat_timeout",
    20,
    "Seconds without a heartbeat before a process is declared dead.",
    env_var="CSTORCH_HEARTBEAT_TIMEOUT",
    parse=_integer,
    check=optional(positive_int),
)
launcher_pid = config.define(
    "launcher_pid",
    None,
    "Set by `python -m cstorch.distributed.launch` for its workers: the "
    "launcher's process id, watched so that a worker stops when its launcher is gone.",
    env_var="CSTORCH_LAUNCHER_PID",
    parse=_integer,
    check=optional(positive_int),
)

# The Model Zoo 1.x command line (compat/modelzoo/common/run_utils/cli_parser.py).
cluster_defaults = config.define(
    "cluster_defaults",
    None,
    "A YAML file whose runconfig gives a system administrator's "
    "defaults to 1.x run.py command lines.",
    env_var="CEREBRAS_WAFER_SCALE_CLUSTER_DEFAULTS",
    check=optional(path),
)

#: Environment the launchers give the processes they start, unless already set: torch's
#: idle OpenMP threads sleep instead of spinning, so a compiled step started right after
#: torch work is not slowed down (1.3x measured on 2 cores, ``make bench``).
LAUNCHED_PROCESS_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


def launched_process_environment(environ) -> dict:
    """``environ`` (a mapping) with ``LAUNCHED_PROCESS_ENV`` filled in where unset."""
    return {**LAUNCHED_PROCESS_ENV, **environ}


def reset() -> None:
    """The process as before any backend (see the module docstring)."""
    config.reset()
    _engine_config.config.reset()


def describe() -> list:
    """Every setting of both layers: the engine's, then cstorch's."""
    return _engine_config.config.describe() + config.describe()
