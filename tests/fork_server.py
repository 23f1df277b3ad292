"""Python processes for tests, forked from one that has already imported torch and JAX.

About two hundred tests start Python processes of their own, and each spends three of its
four seconds importing torch and JAX before it runs a line of the test's script. ``run`` is
``subprocess.run(argv, capture_output=..., text=True, ...)`` for a command that starts this
Python; where it can, it has a server process (one per test process, started at the first
call) fork a child that becomes that command: the child takes the command's working directory,
environment, ``sys.argv``, ``sys.path`` and standard streams, and runs the script, ``-c``
code or ``-m`` module as ``__main__`` until its own interpreter exits, as a fresh process would.
The server imported torch (with torch._dynamo), JAX, numpy, optax and h5py, nothing of this
project, and no engine is started in it (no backend, no thread but OpenBLAS's, which handles
``fork``).

What a fresh interpreter reads before those imports could differ, so each server is started
with the command's own start-up environment (the variables Python and those libraries read:
``ENV_PREFIXES``), one server per such environment, at most ``MAX_SERVERS``; a command that
would need another, that gives the interpreter options other than ``-W``, or that starts another
executable runs as a real process. ``CSTORCH_TEST_FORK_SERVER=0`` runs every command as a real
process. ``subprocess_module()`` serves code under test that calls ``subprocess.run`` itself
(the parity tool's engines).
"""

from __future__ import annotations

import array
import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading

#: A command whose environment differs from the server's in a variable starting with one of
#: these runs as a real process: Python, the threading and allocator libraries, torch and JAX
#: read them at start-up or import.
ENV_PREFIXES = (
    "PYTHON",
    "JAX_",
    "XLA_",
    "TF_",
    "TPU_",
    "TORCH",
    "PYTORCH",
    "CUDA",
    "NCCL",
    "NVIDIA",
    "OMP_",
    "KMP_",
    "GOMP",
    "MKL",
    "OPENBLAS",
    "NUMPY",
    "HDF5",
    "LD_",
    "MALLOC",
    "GLIBC",
    "LC_",
    "LANG",
    "TMP",
    "TEMP",
)

#: torch._dynamo too: a fresh process imports it at its first optimizer (torch.optim's
#: ``Optimizer`` methods are wrapped to disable it), 1.2-1.7 s of nearly every child's run.
PRELOAD = ("numpy", "torch", "torch._dynamo", "jax", "jax.numpy", "optax", "h5py")


# -- the client (a test's process) ------------------------------------------------------------


class _Server:
    def __init__(self, env: dict):
        self.directory = tempfile.mkdtemp(prefix="cstorch-fork-server-")
        self.address = os.path.join(self.directory, "socket")
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), self.address],
            env={k: v for k, v in env.items() if k != "PYTHONPATH"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.process.stdout.readline()
        if ready.strip() != "ready":
            self.process.kill()
            raise RuntimeError(f"the tests' fork server did not start: {ready!r}")

    def close(self):
        self.process.kill()
        self.process.wait()
        for name in os.listdir(self.directory):
            os.unlink(os.path.join(self.directory, name))
        os.rmdir(self.directory)


#: At most this many servers per test process (each holds torch and JAX, ~0.5 GB): a command
#: whose start-up environment would need another runs as a real process.
MAX_SERVERS = 2
_servers: dict = {}  # start-up environment -> _Server, of the process _owner
_owner: int | None = None  # a forked test process must not share its parent's servers
_lock = threading.Lock()


def _start_up_environment(env: dict) -> tuple:
    """The part of ``env`` that Python and the preloaded libraries read before a child runs."""
    return tuple(
        sorted((k, v) for k, v in env.items() if k.startswith(ENV_PREFIXES) and k != "PYTHONPATH")
    )


def _server_for(env: dict) -> _Server | None:
    global _owner
    key = _start_up_environment(env)
    with _lock:
        if _owner != os.getpid():
            _servers.clear()
            _owner = os.getpid()
        server = _servers.get(key)
        if server is not None and server.process.poll() is None:
            return server
        if server is None and len(_servers) >= MAX_SERVERS:
            return None
        server = _servers[key] = _Server(env)
        atexit.register(server.close)
        return server


def _enabled() -> bool:
    return os.environ.get("CSTORCH_TEST_FORK_SERVER", "1") not in ("0", "off", "false")


def _parse(argv):
    """``(warning options, kind, target, arguments)`` of ``python [-W x]... (-c|-m|script)``,
    or None for any other command."""
    if not argv or os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
        return None
    words, warnings = list(argv[1:]), []
    while words[:1] == ["-W"] and len(words) > 1:
        warnings.append(words[1])
        words = words[2:]
    if words[:1] in (["-c"], ["-m"]) and len(words) > 1:
        return warnings, words[0][1], words[1], words[2:]
    if words and not words[0].startswith("-"):
        return warnings, "script", words[0], words[1:]
    return None


def run(argv, *, cwd=None, env=None, timeout=None, capture_output=False, text=False, check=False):
    """``subprocess.run(argv, cwd=, env=, timeout=, capture_output=, text=, check=)``, with the
    standard input closed; served by a child of the fork server where it can be."""
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    command = _parse(argv) if _enabled() else None
    server = _server_for(env) if command is not None else None
    if server is None:
        return subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            timeout=timeout,
            capture_output=capture_output,
            text=text,
            check=check,
            stdin=subprocess.DEVNULL,
        )
    warnings, kind, target, arguments = command
    request = {
        "cwd": os.path.abspath(cwd or os.getcwd()),
        "env": env,
        "warnings": warnings,
        "kind": kind,
        "target": target,
        "argv": arguments,
    }
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        streams = [out.fileno(), err.fileno()] if capture_output else [1, 2]
        with open(os.devnull, "rb") as devnull, socket.socket(socket.AF_UNIX) as connection:
            connection.connect(server.address)
            fds = array.array("i", [devnull.fileno(), *streams])
            connection.sendmsg(
                [json.dumps(request).encode() + b"\n"],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)],
            )
            reply = connection.makefile("r")
            pid = int(reply.readline())
            connection.settimeout(timeout)
            try:
                status = int(reply.readline())
            except (TimeoutError, socket.timeout):
                os.kill(pid, signal.SIGKILL)
                connection.settimeout(None)
                reply = connection.makefile("r")
                reply.readline()
                raise subprocess.TimeoutExpired(argv, timeout) from None
        stdout = stderr = None
        if capture_output:
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
            if text:
                stdout = stdout.decode(errors="replace").replace("\r\n", "\n")
                stderr = stderr.decode(errors="replace").replace("\r\n", "\n")
    result = subprocess.CompletedProcess(argv, status, stdout, stderr)
    if check:
        result.check_returncode()
    return result


def subprocess_module():
    """A stand-in for the ``subprocess`` module whose ``run`` is this module's (for a
    monkeypatch of the module a tool under test calls it through)."""
    import types

    module = types.ModuleType("subprocess")
    module.__dict__.update(vars(subprocess))
    module.run = run
    return module


# -- the server (run as a script) and its children --------------------------------------------


def _serve(address: str):
    """Accepts requests until the test process that started it is gone; answers each with the
    child's pid, then its exit status (a negative signal number, as ``subprocess`` gives)."""
    import selectors

    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(address)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    waiting: dict = {}  # child pid -> the connection to answer
    print("ready", flush=True)
    while os.getppid() == parent:
        for _ in selector.select(timeout=0.02):
            connection, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
            while not message.endswith(b"\n"):
                message += connection.recv(1 << 20)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                connection.close()
                selector.close()
                return json.loads(message), fds
            for fd in fds:
                os.close(fd)
            connection.sendall(f"{pid}\n".encode())
            waiting[pid] = connection
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            connection = waiting.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            try:
                connection.sendall(f"{code}\n".encode())
            except OSError:
                pass  # the test gave up on it (a timeout)
            connection.close()
    raise SystemExit(0)


def _become(request: dict, fds) -> None:
    """Turns this forked child into the requested command's process, then runs it as
    ``__main__`` (its exceptions and exit reach the interpreter as a script's would)."""
    import importlib
    import random
    import runpy
    import types
    import warnings

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    kind, target, arguments = request["kind"], request["target"], request["argv"]
    if kind == "c":
        path0, sys.argv = "", ["-c", *arguments]
    elif kind == "m":
        path0, sys.argv = os.getcwd(), ["-m", *arguments]  # runpy sets argv[0] to the file
    else:
        path0 = os.path.dirname(os.path.realpath(target))
        sys.argv = [target, *arguments]
    python_path = os.environ.get("PYTHONPATH", "")
    extra = [os.path.abspath(p) if p else os.getcwd() for p in python_path.split(os.pathsep)]
    sys.path[:] = [path0, *(extra if python_path else []), *_BASE_PATH]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    sys.warnoptions[:] = request["warnings"]
    for option in request["warnings"]:
        warnings._setoption(option)  # type: ignore[attr-defined]  # as -W does
    random.seed()
    import numpy

    numpy.random.seed()
    if kind == "m":
        runpy._run_module_as_main(target)  # type: ignore[attr-defined]  # as -m does
        return
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=__builtins__, __spec__=None, __loader__=None)
    if kind == "c":
        source, filename = target, "<string>"
    else:
        main.__file__ = target
        with open(target, "rb") as f:
            source, filename = f.read(), target
    sys.modules["__main__"] = main
    exec(compile(source, filename, "exec"), main.__dict__)


_BASE_PATH: list = []

if __name__ == "__main__":
    _BASE_PATH[:] = sys.path[1:]  # started without PYTHONPATH: the interpreter's own entries
    import gc
    import importlib
    import importlib.util
    import warnings

    # The preloaded modules' objects live as long as any child: the collector leaves them
    # alone, so a child's collections (and its exit) do not copy the server's pages. Not
    # triton's (torch's CUDA builds, through torch._dynamo): its bindings report every object
    # still alive at exit as a leak, on stderr; modules that import it come after the freeze.
    after_freeze = ("torch._dynamo",) if importlib.util.find_spec("triton") else ()
    for name in PRELOAD:
        if name not in after_freeze:
            importlib.import_module(name)
    gc.collect()
    gc.freeze()
    for name in after_freeze:
        importlib.import_module(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with OpenBLAS's thread
        child = _serve(sys.argv[1])
    _become(*child)
