"""JAX devices, meshes and how a program's arrays are laid out on them (no torch here).

The modeled wafer is a two-dimensional mesh with axes ``("csx", "ws")``: ``num_csx`` systems
run the step data-parallel, and each system is modeled by ``ws`` devices. Batch inputs are
split along their first dimension over every device (``csx`` × ``ws``) and XLA's SPMD
partitioner inserts the gradient reductions, so the numbers are those of the whole batch on
one device. With weight servers, parameters and optimizer state are split along their first
dimension too, and -- as a cluster's weight servers hold each weight once -- over the whole
mesh (falling back to the ``ws`` axis alone, then to replication, when the dimension does not
divide): the weights are "streamed" (gathered where they are used), like ZeRO-3/FSDP.

The mesh may span several processes (``jax.distributed``): every process then runs the same
program, feeds its own slice of the global batch (``input_array``) and reads global values
through ``host_value``. Axes of size 1 are left out of partition specs.
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jax_backend.errors import CstorchError, CstorchRuntimeError, CstorchValueError
from jax_backend.jax_settings import engine_scope, in_engine_scope

DATA_AXIS = "csx"  # data parallelism: the systems of the cluster
STATE_AXIS = "ws"  # the devices of one system; sharded state is split over it
AXIS = DATA_AXIS


def devices(platform: str | None = None) -> list:
    """The JAX devices of a platform ("cpu", "gpu"), or of the default platform; [] if none.
    In a multi-process job these are the devices of every process, in process order."""
    try:
        return list(jax.devices(platform)) if platform else list(jax.devices())
    except RuntimeError:
        return []


def platforms() -> list:
    return sorted({d.platform for d in jax.devices()})


def is_multi_process() -> bool:
    return jax.process_count() > 1


@dataclasses.dataclass(frozen=True)
class Layout:
    """Placement of a program's state and inputs on a ``(csx, ws)`` device mesh."""

    mesh: Mesh
    shard_state: bool = False

    @classmethod
    def build(
        cls, available: list, num_csx: int, devices_per_csx: int = 1, shard_state: bool = False
    ) -> "Layout":
        """A ``num_csx`` × ``devices_per_csx`` mesh over the first devices of ``available``
        (in a multi-process job: all of them, so that every process takes part)."""
        needed = num_csx * devices_per_csx
        if needed > len(available):
            raise CstorchRuntimeError(
                f"num_csx={num_csx} systems of {devices_per_csx} device(s) each need {needed} "
                f"JAX devices but only {len(available)} exist. On CPU, model more devices "
                f"with XLA_FLAGS=--xla_force_host_platform_device_count={needed} (set before "
                "JAX starts)."
            )
        if is_multi_process() and needed != len(available):
            raise CstorchValueError(
                f"A multi-process job must use every device of every process: num_csx="
                f"{num_csx} × {devices_per_csx} device(s) per system = {needed}, but the job "
                f"has {len(available)} devices ({jax.process_count()} processes). Choose "
                f"num_csx (and max_wgt_servers) so that their product is {len(available)}."
            )
        grid = np.array(available[:needed], dtype=object).reshape(num_csx, devices_per_csx)
        return cls(Mesh(grid, (DATA_AXIS, STATE_AXIS)), shard_state)

    @classmethod
    def data_parallel(cls, available: list, num_replicas: int, shard_state: bool = False):
        return cls.build(available, num_replicas, 1, shard_state)

    @property
    def size(self) -> int:
        return self.mesh.size

    def _spec(self, axes: tuple, ndim: int) -> PartitionSpec:
        axes = tuple(a for a in axes if self.mesh.shape[a] > 1)
        if not axes or ndim == 0:
            return PartitionSpec()
        return PartitionSpec(axes[0] if len(axes) == 1 else axes)

    def _split(self, shape, axes: tuple):
        """Sharding that splits dim 0 over ``axes``, or None when it does not divide."""
        parts = math.prod(self.mesh.shape[a] for a in axes)
        if len(shape) and shape[0] % parts == 0:
            return NamedSharding(self.mesh, self._spec(axes, len(shape)))
        return None

    def state_sharding(self, shape) -> NamedSharding:
        if self.shard_state:
            for axes in ((DATA_AXIS, STATE_AXIS), (STATE_AXIS,)):
                sharding = self._split(shape, axes)
                if sharding is not None:
                    return sharding
        return self.replicated()

    def input_sharding(self, shape) -> NamedSharding:
        """Batch inputs are split along dim 0 over every device (when it divides evenly, else
        replicated; a multi-process job requires it to divide)."""
        sharding = self._split(shape, (DATA_AXIS, STATE_AXIS))
        if sharding is not None:
            return sharding
        if is_multi_process() and len(shape):
            raise CstorchValueError(
                f"A batch input of global shape {tuple(shape)} cannot be split over the "
                f"{self.size} devices of the job: its first dimension must be a multiple of "
                f"{self.size}. Each of the {jax.process_count()} processes feeds "
                f"{self.size // jax.process_count()} device(s); make the per-process batch a "
                "multiple of that."
            )
        return self.replicated()

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    @in_engine_scope
    def place_state(self, host: np.ndarray) -> jax.Array:
        """A global array holding ``host`` (the same full value on every process) as the
        layout places state; each process uploads only the shards it holds."""
        host = np.asarray(host)
        return jax.make_array_from_callback(
            host.shape, self.state_sharding(host.shape), lambda index: host[index]
        )

    # ------------------------------------------------------------------ per-process inputs
    def global_input_shape(self, local_shape) -> tuple:
        """The global shape of a batch input of which each process holds ``local_shape``
        (its own contiguous slice along dim 0, in process order). Scalars are replicated."""
        local_shape = tuple(local_shape)
        if not is_multi_process() or not local_shape:
            return local_shape
        return (local_shape[0] * jax.process_count(),) + local_shape[1:]

    def input_array(self, value):
        """A step input as the program expects it: JAX arrays pass through; on one process a
        host array is left to jit's own transfer; across processes the host array is this
        process's slice of the global batch."""
        if isinstance(value, jax.Array) or not is_multi_process():
            return value
        shape = self.global_input_shape(np.shape(value))
        return jax.make_array_from_process_local_data(self.input_sharding(shape), value, shape)


class PeerFailureError(CstorchError, RuntimeError):
    """A step of a multi-process job failed, most likely because another process died."""


peer_failure: PeerFailureError | None = None  # set once a multi-process job has failed


def host_value(array) -> np.ndarray:
    """The global value of an array as numpy. A value split across processes is gathered,
    which is a collective: every process must ask for it, in the same order."""
    if not isinstance(array, jax.Array):
        return np.asarray(array)
    try:
        if array.is_fully_addressable:
            return np.asarray(array)
        if array.is_fully_replicated:
            return np.asarray(array.addressable_data(0))
        from jax.experimental import multihost_utils

        with engine_scope():
            return np.asarray(multihost_utils.process_allgather(array, tiled=True))
    except jax.errors.JaxRuntimeError as error:
        if not is_multi_process():
            raise
        global peer_failure
        first_line = (str(error).strip().splitlines() or [""])[0]
        peer_failure = PeerFailureError(
            f"Process {jax.process_index()} of a job of {jax.process_count()} processes "
            f"failed in a step: {first_line}. This usually means another process of the job "
            "died or was killed (see its log); the job cannot continue. Restart every "
            "process, from the last checkpoint."
        )
        raise peer_failure from error


# ------------------------------------------------------------------ communication in HLO
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_INSTRUCTION = re.compile(
    r"=\s*(?P<shape>\(.*?\)|\S+)\s+(?P<op>" + "|".join(_COLLECTIVES) + r")(?:-start)?\("
)
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|f8\w*)\[([\d,]*)\]")
_BITS = {"pred": 8, "bf16": 16}


def _shape_bytes(shape: str) -> int:
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        bits = _BITS.get(dtype) or int(re.sub(r"\D", "", dtype.split("e")[0]) or 8)
        total += math.prod(int(d) for d in dims.split(",") if d) * bits // 8
    return total


def communication(hlo_text: str) -> dict:
    """Collectives of a compiled (optimized) HLO module: ``{op: (count, bytes)}``, bytes being
    the size of each op's result on one device (the full value for an all-gather or
    all-reduce, one shard for a reduce-scatter). ``*-done`` halves are not counted twice."""
    totals: dict = {}
    for match in _INSTRUCTION.finditer(hlo_text):
        count, size = totals.get(match["op"], (0, 0))
        shape = match["shape"]
        if shape.startswith("(") and match.group(0).rstrip("(").endswith("-start"):
            # an async start returns (operands, results): count the results only
            parts = _ARRAY.findall(shape)
            shape = " ".join(f"{d}[{s}]" for d, s in parts[len(parts) // 2 :])
        totals[match["op"]] = (count + 1, size + _shape_bytes(shape))
    return totals
