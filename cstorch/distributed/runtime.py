"""Joining a multi-process job on JAX's distributed runtime (``jax.distributed``).

A run spread over several processes (on one host or many) is one JAX job: every process runs
the same script and the same compiled step over one global device mesh. The CSX backend
joins the job when it is created (the GPU backend with ``enable_distributed=True``), from
``ClusterConfig.distributed`` or else from the environment:

=============================== ============================================================
``CSTORCH_COORDINATOR_ADDRESS`` ``host:port`` of process 0, which hosts the coordinator
``CSTORCH_NUM_PROCESSES``       number of processes in the job
``CSTORCH_PROCESS_ID``          this process's index, ``0 <= id < num_processes``
``CSTORCH_INIT_TIMEOUT``        seconds to wait for every process to join (default 60)
``CSTORCH_HEARTBEAT_TIMEOUT``   seconds without a heartbeat after which a process counts as
                                dead and the job is stopped (default 20)
``CSTORCH_LAUNCHER_PID``        set by the launcher: the process ends (SIGTERM, then
                                SIGKILL after 5 s) when the launcher is gone
=============================== ============================================================

``python -m cstorch.distributed.launch`` sets them for local processes.

Failure behaviour (the knobs above bound it):

* a process that never joins: the others raise ``DistributedError`` after the init timeout;
* a process that dies: the others' next collective fails at once (the transport sees the
  connection drop) and the step raises ``PeerFailureError``; the process then exits with
  status 1 instead of waiting for the job's shutdown barrier. A peer that stops without
  closing its connections (a frozen host) is declared dead by the coordinator after the
  heartbeat timeout, which ends every process with the runtime's "another task died" error.

SIGTERM keeps its meaning after joining: ``jax.distributed.initialize`` installs a preemption
notifier that catches SIGTERM and only logs it (``preemption_notifier.cc ... SIGTERM caught``),
for JAX's preemption sync points, which cstorch does not use. A joined process would then
outlive a scheduler's SIGTERM, the launcher's forwarded one, and the death signal the kernel
sends when the launcher dies. ``join`` gives SIGTERM back its handler from before the join
(the default, ending the process at once, even inside a collective).
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import os
import re
import signal
import socket
import sys
import threading
import time
from typing import Optional

from cstorch import config
from jax_backend.config import non_negative_int, positive_int
from jax_backend.errors import CstorchError, CstorchValueError
from jax_backend.user_frames import warn

ENV_COORDINATOR = config.coordinator_address.env_var
ENV_NUM_PROCESSES = config.num_processes.env_var
ENV_PROCESS_ID = config.process_id.env_var
ENV_INIT_TIMEOUT = config.init_timeout.env_var
ENV_HEARTBEAT_TIMEOUT = config.heartbeat_timeout.env_var
ENV_LAUNCHER_PID = config.launcher_pid.env_var

_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[^\s:\[\]]+):\d{1,5}$")


class DistributedError(CstorchError, RuntimeError):
    """A multi-process job could not be formed or was misconfigured."""


_POSITIVE, _NON_NEGATIVE = config.named_check(positive_int), config.named_check(non_negative_int)


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """The multi-process job this process belongs to (all None: a single-process run)."""

    coordinator_address: Optional[str] = None
    num_processes: Optional[int] = None
    process_id: Optional[int] = None
    initialization_timeout: int = 60
    heartbeat_timeout: int = 20

    def __post_init__(self):
        if self.coordinator_address is not None and (
            not isinstance(self.coordinator_address, str)
            or not _ADDRESS.match(self.coordinator_address)
        ):
            raise CstorchValueError(
                f"coordinator_address must look like 'host:port', got {self.coordinator_address!r}."
            )
        checked = {"initialization_timeout": _POSITIVE, "heartbeat_timeout": _POSITIVE}
        if self.num_processes is not None:
            checked["num_processes"] = _POSITIVE
        if self.process_id is not None:
            checked["process_id"] = _NON_NEGATIVE
        for name, validate in checked.items():
            value = getattr(self, name)
            if isinstance(value, str) and value.strip().isdigit():  # from the environment
                value = int(value)
            object.__setattr__(self, name, validate(name, value))

    @classmethod
    def from_env(cls, environ=None) -> "DistributedConfig":
        env = os.environ if environ is None else environ
        kwargs = {}
        for field, name in (
            ("coordinator_address", ENV_COORDINATOR),
            ("num_processes", ENV_NUM_PROCESSES),
            ("process_id", ENV_PROCESS_ID),
            ("initialization_timeout", ENV_INIT_TIMEOUT),
            ("heartbeat_timeout", ENV_HEARTBEAT_TIMEOUT),
        ):
            if env.get(name, "") != "":
                kwargs[field] = env[name]
        try:
            return cls(**kwargs)
        except ValueError as error:
            raise CstorchValueError(
                f"Invalid distributed settings in the environment: {error}"
            ) from None

    @classmethod
    def from_torchrun_env(cls, environ=None) -> "DistributedConfig":
        """The job torchrun describes (``MASTER_ADDR:MASTER_PORT``, ``WORLD_SIZE``,
        ``RANK``); the coordinator takes the master's port, as nothing else uses it here."""
        env = os.environ if environ is None else environ
        try:
            return cls(f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", env["WORLD_SIZE"], env["RANK"])
        except KeyError as missing:
            raise DistributedError(
                f"The torchrun environment lacks {missing.args[0]}: start the script with "
                "torchrun or `python -m cstorch.distributed.launch`."
            ) from None

    def merged_with(self, other: "DistributedConfig") -> "DistributedConfig":
        """These settings, with unset ones taken from ``other`` (e.g. the environment)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for f in dataclasses.fields(self):
            if values[f.name] is None or values[f.name] == f.default:
                values[f.name] = getattr(other, f.name)
        return DistributedConfig(**values)

    @property
    def is_multi_process(self) -> bool:
        return (self.num_processes or 1) > 1

    def validate(self) -> None:
        if not self.is_multi_process:
            return
        missing = [
            name
            for name, value in (
                ("coordinator address", self.coordinator_address),
                ("process id", self.process_id),
            )
            if value is None
        ]
        if missing:
            raise DistributedError(
                f"A job of {self.num_processes} processes also needs the {' and '.join(missing)}"
                f" (ClusterConfig.distributed or ${ENV_COORDINATOR} / ${ENV_PROCESS_ID}). "
                "Start the processes with `python -m cstorch.distributed.launch`."
            )
        if self.process_id >= self.num_processes:
            raise DistributedError(
                f"process_id {self.process_id} is out of range for a job of "
                f"{self.num_processes} processes (0 ... {self.num_processes - 1})."
            )


_joined: Optional[DistributedConfig] = None


def joined() -> Optional[DistributedConfig]:
    """The settings of the multi-process job this process joined (None: not joined)."""
    return _joined


def requested(config: Optional[DistributedConfig] = None) -> DistributedConfig:
    """The job asked for by ``config`` and the environment (without joining it)."""
    if _joined is not None:
        return _joined
    env = DistributedConfig.from_env()
    return env if config is None else config.merged_with(env)


def join(config: Optional[DistributedConfig] = None) -> bool:
    """Joins the multi-process job described by ``config`` (or the environment); returns
    whether this process is part of one. Safe to call again (later calls must agree)."""
    global _joined
    wanted = requested(config)
    wanted.validate()
    if _joined is not None:
        return True
    if not wanted.is_multi_process:
        return False
    import jax

    if jax.distributed.is_initialized():  # joined by the user's own jax.distributed call
        _joined = wanted
        watch_launcher()
        _take_back_sigterm(signal.SIG_DFL)
        return True
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise DistributedError(
            "This process must join its multi-process job before JAX starts its devices, "
            "but JAX is already running (something called jax.devices() or computed with "
            "JAX). Create the cstorch backend first thing in the script."
        )
    if wanted.process_id == 0:  # process 0 hosts the coordinator
        busy = coordinator_port_in_use(wanted.coordinator_address)
        if busy is not None:
            raise DistributedError(busy)
    watch_launcher()
    # CPU collectives between processes go through gloo (TCP); GPUs use NCCL by default.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    atexit.register(_exit_after_failure)  # runs before JAX's own shutdown barrier
    sigterm = signal.getsignal(signal.SIGTERM)
    error = _initialize_within(wanted)
    _take_back_sigterm(sigterm)
    if error is not None:
        raise DistributedError(
            f"Process {wanted.process_id} could not join the job of {wanted.num_processes} "
            f"processes at {wanted.coordinator_address} within "
            f"{wanted.initialization_timeout} s ({error}). Check that every process was "
            "started with the same coordinator address and process count, that none of them "
            f"failed early, and that the coordinator's port is free (${ENV_INIT_TIMEOUT} sets "
            "the wait)."
        )
    _joined = wanted
    return True


_failed_to_join = False


def _initialize_within(wanted: DistributedConfig) -> Optional[str]:
    """Calls ``jax.distributed.initialize``, giving up after the init timeout; returns why
    it failed (None on success). The runtime's own deadline is set later than ours because
    it ends the process from a native thread, without a Python exception."""
    import jax

    outcome = {}
    timeouts = _runtime_timeouts(jax.distributed.initialize, wanted)

    def connect():
        try:
            jax.distributed.initialize(
                wanted.coordinator_address,
                wanted.num_processes,
                wanted.process_id,
                initialization_timeout=wanted.initialization_timeout + 60,
                **timeouts,
            )
        except Exception as error:  # noqa: BLE001 - the runtime raises several types
            first_line = (str(error).strip().splitlines() or [""])[0]
            outcome["error"] = f"{type(error).__name__}: {first_line}"

    thread = threading.Thread(target=connect, name="cstorch-join", daemon=True)
    thread.start()
    thread.join(wanted.initialization_timeout)
    global _failed_to_join
    if thread.is_alive():
        _failed_to_join = True
        return "the other processes did not all arrive"
    if "error" in outcome:
        _failed_to_join = True
    return outcome.get("error")


def _bind_address(coordinator_address: str, environ=None) -> tuple:
    """``(family, host, port)`` the coordinator listens on: JAX binds every address
    (``[::]``) on the coordinator's port unless ``JAX_COORDINATOR_BIND_ADDRESS`` says where."""
    env = os.environ if environ is None else environ
    bind = (
        env.get("JAX_COORDINATOR_BIND_ADDRESS") or "[::]:" + coordinator_address.rsplit(":", 1)[1]
    )
    host, port = bind.rsplit(":", 1)
    host = host.strip("[]")
    return (socket.AF_INET6 if ":" in host else socket.AF_INET), host, int(port)


def coordinator_port_in_use(coordinator_address: str, environ=None) -> Optional[str]:
    """Why the coordinator of ``coordinator_address`` could not listen on this host (None when
    it can). JAX's runtime does not report that: it ends the process with SIGSEGV."""
    family, host, port = _bind_address(coordinator_address, environ)
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:  # no IPv6 on this host: ask about IPv4's every-address instead
        family, host = socket.AF_INET, ("0.0.0.0" if host == "::" else host)
        sock = socket.socket(family, socket.SOCK_STREAM)
    with sock:
        # As the coordinator's gRPC server does: a port left in TIME_WAIT counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError as error:
            if error.errno not in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                return None  # not a verdict on the port; let the runtime try
            return (
                f"The coordinator of this job cannot listen on port {port} "
                f"({os.strerror(error.errno)}): another program or job holds it. "
                "Choose a free port for the coordinator address "
                f"(${ENV_COORDINATOR}, or the launcher's --port; the launcher picks a free "
                "one when --port is not given)."
            )
    return None


def _take_back_sigterm(handler) -> None:
    """Puts back SIGTERM's ``handler`` (Python's view from before the join; None, a handler
    set outside Python, counts as the default) over the one JAX's preemption notifier
    installed while joining. Python sets handlers from the main thread only; elsewhere the
    default is set through libc, and a Python handler is left to the launcher watch's
    SIGKILL."""
    handler = signal.SIG_DFL if handler is None else handler
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
    elif handler == signal.SIG_DFL:
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
            libc.signal(int(signal.SIGTERM), ctypes.c_void_p(int(signal.SIG_DFL)))
        except (OSError, AttributeError):
            pass


#: Seconds the watch waits after its SIGTERM before it sends SIGKILL (a handler that does not
#: end the process, or one that cannot run while the main thread waits in native code).
WATCH_KILL_AFTER = 5.0


def watch_launcher(
    environ=None, interval: float = 1.0, kill_after: float = WATCH_KILL_AFTER
) -> bool:
    """In a process started by the launcher (``CSTORCH_LAUNCHER_PID``), a daemon thread that
    ends the process once the launcher is gone: SIGTERM, then SIGKILL ``kill_after`` seconds
    later if the process still runs. On Linux the kernel also sends SIGTERM at once
    (``PR_SET_PDEATHSIG``, asked by the launcher); the thread covers other systems and a
    SIGTERM that something caught. Returns whether a watch runs."""
    env = os.environ if environ is None else environ
    launcher = env.get(ENV_LAUNCHER_PID, "")
    if not launcher.isdigit() or os.getppid() != int(launcher):
        return False  # not a launcher's own child (e.g. a subprocess inheriting the variable)
    if any(t.name == "cstorch-launcher-watch" for t in threading.enumerate()):
        return True

    def watch():
        while os.getppid() == int(launcher):
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(kill_after)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="cstorch-launcher-watch", daemon=True).start()
    return True


def _runtime_timeouts(initialize, wanted: DistributedConfig) -> dict:
    """The heartbeat and shutdown timeouts, as keywords of ``initialize`` (JAX 0.7 added
    them; before, the runtime's own defaults apply: a frozen process is declared dead after
    about 100 s)."""
    import inspect

    accepted = inspect.signature(initialize).parameters
    timeouts = {
        "heartbeat_timeout_seconds": wanted.heartbeat_timeout,
        "shutdown_timeout_seconds": max(wanted.heartbeat_timeout, 10),
    }
    if (
        "heartbeat_timeout_seconds" not in accepted
        and wanted.heartbeat_timeout != DistributedConfig.heartbeat_timeout
    ):
        warn(
            f"This JAX ({_jax_version()}) cannot set the heartbeat timeout: a frozen "
            "process is declared dead after the runtime's default (about 100 s), "
            f"not after {wanted.heartbeat_timeout} s."
        )
    return {name: value for name, value in timeouts.items() if name in accepted}


def _jax_version() -> str:
    import jax

    return f"JAX {jax.__version__}"


def _exit_after_failure() -> None:
    """After a peer failed (or the job never formed), the job's shutdown barrier can only
    fail too, and aborts the process with a long native log: end the process with status 1
    after flushing instead."""
    from jax_backend import mesh

    if mesh.peer_failure is not None or _failed_to_join:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def process_index() -> int:
    """This process's index in the job (0 when single-process); never starts JAX."""
    job = requested()
    return job.process_id or 0 if job.is_multi_process else 0


def process_count() -> int:
    return requested().num_processes or 1
