"""``cstorch.cirh``: the reference's Cerebras-IR custom ops (``torch.ops.cirh``).

They are intrinsics of the wafer compiler (fused top-k / top-p sampling for generation). The
ops are declared here with the same names so code that refers to them imports, but they have
no implementation: calling one raises NotImplementedError saying what to use instead.
"""

import torch

from jax_backend.errors import CstorchNotImplementedError

_lib = torch.library.Library("cirh", "DEF")
_lib.define("FusedTopK(Tensor input, int k, int dimension) -> Tensor")
_lib.define("FusedTopP(Tensor fused_topk, Tensor p, Tensor u, Tensor k) -> Tensor")


def _unavailable(name):
    def op(*args, **kwargs):
        raise CstorchNotImplementedError(
            f"cstorch.cirh.{name} is a Cerebras wafer-compiler intrinsic with no implementation "
            "here. Sample with torch.topk / torch.softmax / torch.multinomial instead."
        )

    return op


for _name in ("FusedTopK", "FusedTopP"):
    _lib.impl(_name, _unavailable(_name), "CompositeExplicitAutograd")

cirh = torch.ops.cirh
