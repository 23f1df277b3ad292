"""Starts a multi-process job on this machine: ``python -m cstorch.distributed.launch
--num_processes 2 script.py [script args]``.

Every process runs the same script with the ``CSTORCH_*`` variables of
``cstorch.distributed.runtime`` set (coordinator on 127.0.0.1, a free port); the CSX backend
then joins the job. ``--devices_per_process N`` models N CPU devices in each process
(``--xla_force_host_platform_device_count``). The processes share this terminal's output.
When one process fails, the others get ``--grace`` seconds to stop by themselves (they
normally fail fast, see the runtime's failure behaviour) and are then terminated; the exit
status is that of the first process that failed (0 when all succeeded).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

from cstorch import config
from cstorch.distributed import runtime


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def process_environment(base: dict, process_id: int, num_processes: int, address: str,
                        devices_per_process: int | None = None,
                        init_timeout: int | None = None,
                        heartbeat_timeout: int | None = None) -> dict:
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
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        flags.append(f"--xla_force_host_platform_device_count={devices_per_process}")
        env["XLA_FLAGS"] = " ".join(flags)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cstorch.distributed.launch",
        description="Run SCRIPT as a multi-process cstorch job on this machine (loopback).")
    parser.add_argument("--num_processes", type=int, required=True)
    parser.add_argument("--devices_per_process", type=int, default=None,
                        help="CPU devices to model in each process")
    parser.add_argument("--port", type=int, default=None,
                        help="coordinator port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--init_timeout", type=int, default=None,
                        help=f"seconds to wait for every process to join "
                             f"(${runtime.ENV_INIT_TIMEOUT})")
    parser.add_argument("--heartbeat_timeout", type=int, default=None,
                        help=f"seconds of silence after which a process counts as dead "
                             f"(${runtime.ENV_HEARTBEAT_TIMEOUT})")
    parser.add_argument("--grace", type=float, default=30.0,
                        help="seconds the other processes get to stop after one failed")
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    return parser


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
    processes = []
    for process_id in range(args.num_processes):
        env = process_environment(os.environ, process_id, args.num_processes, address,
                                  args.devices_per_process, args.init_timeout,
                                  args.heartbeat_timeout)
        processes.append(subprocess.Popen([sys.executable, args.script, *args.script_args],
                                          env=env))
    failed = None
    try:
        while failed is None and any(p.poll() is None for p in processes):
            failed = next((p for p in processes if p.poll() not in (None, 0)), None)
            time.sleep(0.1)
        failed = failed or next((p for p in processes if p.returncode != 0), None)
        if failed is not None:
            print(f"[launch] process {processes.index(failed)} exited with status "
                  f"{failed.returncode}; stopping the others.", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        for p in processes:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        args.grace = min(args.grace, 5.0)
    finally:
        _stop(processes, args.grace)
    if failed is not None:
        return failed.returncode if failed.returncode > 0 else 1
    return 0 if all(p.returncode == 0 for p in processes) else 1


if __name__ == "__main__":
    sys.exit(main())
