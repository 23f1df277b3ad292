"""Starts a multi-process job on this machine: ``python -m cstorch.distributed.launch
--num_processes 2 script.py [script args]``.

Every process runs the same script with the ``CSTORCH_*`` variables of
``cstorch.distributed.runtime`` set (coordinator on 127.0.0.1, a free port); the CSX backend
then joins the job. ``--devices_per_process N`` models N CPU devices in each process
(``--xla_force_host_platform_device_count``). The processes share this terminal's output.
When one process fails, the others get ``--grace`` seconds to stop by themselves (they
normally fail fast, see the runtime's failure behaviour) and are then terminated; the exit
status is that of the first process that failed (0 when all succeeded).

The launcher owns its processes: SIGTERM or SIGHUP (what a scheduler or a closed terminal
sends) and Ctrl-C are forwarded to every process, which is killed if it has not stopped
after ``min(--grace, 10)`` seconds (then 5 more after SIGTERM); the launcher then exits with
128 + the signal's number. The processes also end when the launcher itself dies, even by
SIGKILL: on Linux the kernel sends them SIGTERM (``PR_SET_PDEATHSIG``), and a thread of the
runtime notices too (``CSTORCH_LAUNCHER_PID``; it sends SIGKILL 5 s after its SIGTERM if the
process still runs). A process that joined the job gets SIGTERM's handler back from JAX's
preemption notifier, which would otherwise swallow it (see ``runtime``).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import time

from cstorch import config
from cstorch.distributed import runtime
from jax_backend.errors import CstorchError


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def process_environment(
    base: dict,
    process_id: int,
    num_processes: int,
    address: str,
    devices_per_process: int | None = None,
    init_timeout: int | None = None,
    heartbeat_timeout: int | None = None,
) -> dict:
    """The environment of process ``process_id`` of a local job."""
    env = config.launched_process_environment(base)
    env[runtime.ENV_COORDINATOR] = address
    env[runtime.ENV_NUM_PROCESSES] = str(num_processes)
    env[runtime.ENV_PROCESS_ID] = str(process_id)
    if init_timeout is not None:
        env[runtime.ENV_INIT_TIMEOUT] = str(init_timeout)
    if heartbeat_timeout is not None:
        env[runtime.ENV_HEARTBEAT_TIMEOUT] = str(heartbeat_timeout)
    if devices_per_process is not None:
        flags = [
            f
            for f in env.get("XLA_FLAGS", "").split()
            if not f.startswith("--xla_force_host_platform_device_count")
        ]
        flags.append(f"--xla_force_host_platform_device_count={devices_per_process}")
        env["XLA_FLAGS"] = " ".join(flags)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cstorch.distributed.launch",
        description="Run SCRIPT as a multi-process cstorch job on this machine (loopback).",
    )
    parser.add_argument("--num_processes", type=int, required=True)
    parser.add_argument(
        "--devices_per_process", type=int, default=None, help="CPU devices to model in each process"
    )
    parser.add_argument(
        "--port", type=int, default=None, help="coordinator port on 127.0.0.1 (default: a free one)"
    )
    parser.add_argument(
        "--init_timeout",
        type=int,
        default=None,
        help=f"seconds to wait for every process to join (${runtime.ENV_INIT_TIMEOUT})",
    )
    parser.add_argument(
        "--heartbeat_timeout",
        type=int,
        default=None,
        help=f"seconds of silence after which a process counts as dead "
        f"(${runtime.ENV_HEARTBEAT_TIMEOUT})",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="seconds the other processes get to stop after one failed",
    )
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    return parser


_PR_SET_PDEATHSIG = 1


def _death_signal_setter(launcher_pid: int):
    """A ``preexec_fn`` for the workers: on Linux, the kernel sends the worker SIGTERM when the
    launcher dies (and a worker whose launcher died while it was starting exits at once).
    None where ``prctl`` does not exist (the runtime's watch thread covers those systems)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def set_death_signal():  # runs in the child, between fork and exec
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != launcher_pid:
            os._exit(1)

    return set_death_signal


class _Signalled(CstorchError):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_once(signum, frame):
    """The first SIGTERM/SIGHUP interrupts the launcher's wait; later ones are ignored while
    it stops the processes."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise _Signalled(signum)


def _stop(processes, grace: float) -> None:
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        time.sleep(0.1)
    for p in processes:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        time.sleep(0.1)
    for p in processes:
        if p.poll() is None:
            p.kill()
            p.wait()


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.num_processes < 1:
        raise SystemExit("--num_processes must be at least 1.")
    if args.devices_per_process is not None and args.devices_per_process < 1:
        raise SystemExit("--devices_per_process must be at least 1.")
    if not os.path.isfile(args.script):
        raise SystemExit(f"No such script: {args.script!r}.")
    address = f"127.0.0.1:{args.port or free_port()}"
    if args.port:
        busy = runtime.coordinator_port_in_use(address)
        if busy is not None:
            raise SystemExit(busy)
    previous = {sig: signal.signal(sig, _raise_once) for sig in (signal.SIGTERM, signal.SIGHUP)}
    processes, failed, signalled = [], None, None
    try:
        launcher_env = dict(os.environ, **{runtime.ENV_LAUNCHER_PID: str(os.getpid())})
        for process_id in range(args.num_processes):
            env = process_environment(
                launcher_env,
                process_id,
                args.num_processes,
                address,
                args.devices_per_process,
                args.init_timeout,
                args.heartbeat_timeout,
            )
            processes.append(
                subprocess.Popen(
                    [sys.executable, args.script, *args.script_args],
                    env=env,
                    preexec_fn=_death_signal_setter(os.getpid()),
                )
            )
        while failed is None and any(p.poll() is None for p in processes):
            failed = next((p for p in processes if p.poll() not in (None, 0)), None)
            time.sleep(0.1)
        failed = failed or next((p for p in processes if p.returncode != 0), None)
        if failed is not None:
            print(
                f"[launch] process {processes.index(failed)} exited with status "
                f"{failed.returncode}; stopping the others.",
                file=sys.stderr,
                flush=True,
            )
    except (KeyboardInterrupt, _Signalled) as stop:
        signalled = getattr(stop, "signum", signal.SIGINT)
        print(
            f"[launch] {signal.Signals(signalled).name}: stopping the processes.",
            file=sys.stderr,
            flush=True,
        )
        for p in processes:
            if p.poll() is None:
                p.send_signal(signalled)
        args.grace = min(args.grace, 10.0)
    finally:
        _stop(processes, args.grace)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if signalled is not None:
        return 128 + signalled
    if failed is not None:
        return failed.returncode if failed.returncode > 0 else 1
    return 0 if all(p.returncode == 0 for p in processes) else 1


if __name__ == "__main__":
    sys.exit(main())
