"""Capture's decomposition table leaves out torch.export's entries for CompositeImplicitAutograd
(CIA) ops (``capture._core_aten_table``): building them walks the dispatcher, the largest fixed
cost of a first capture. The claim that makes this safe is that ``make_fx`` below autograd
decomposes a CIA op the same way with or without its entry (the entry or, without it, the
tracer's own fallback both run the op's CIA kernel). Here, training steps made of CIA
ops (linear, conv with string padding, interpolation, group/instance/layer norm, einsum,
label-smoothed cross-entropy, reflection padding, pixel shuffle, scaled dot-product attention,
normalize, dropout, ...) are captured both ways and must give the same graph, and the step
must match eager torch."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions

import jax_backend.capture as capture
from jax_backend import Program, Slot, capture_step, dtypes
from tests.training import descending

pytestmark = pytest.mark.core  # the CIA set changes with torch: every leg runs it


class CompositeOps(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding="same")
        self.group_norm = torch.nn.GroupNorm(2, 8)
        self.instance_norm = torch.nn.InstanceNorm2d(8, affine=True)
        self.shuffle = torch.nn.PixelShuffle(2)
        self.layer_norm = torch.nn.LayerNorm(16)
        self.qkv = torch.nn.Linear(16, 48)
        self.head = torch.nn.Linear(16, 5)
        self.bilinear = torch.nn.Bilinear(16, 16, 4)

    def forward(self, x, y):
        h = F.silu(self.group_norm(self.conv(x)))
        h = self.instance_norm(F.interpolate(h, scale_factor=2, mode="bilinear"))
        h = F.pad(self.shuffle(h), (1, 1, 1, 1), mode="reflect")  # [B, 2, 18, 18]
        tokens = F.adaptive_avg_pool2d(h, (4, 4)).flatten(2).transpose(1, 2)  # [B, 16, 2]
        tokens = torch.einsum("bnc,cd->bnd", tokens, torch.ones(2, 16) / 4)
        q, k, v = self.qkv(self.layer_norm(tokens)).chunk(3, dim=-1)
        attended = F.scaled_dot_product_attention(q, k, v)
        pooled = F.normalize(F.dropout(attended, 0.0, self.training).mean(1), dim=-1)
        logits = self.head(F.gelu(pooled, approximate="tanh"))
        extra = self.bilinear(pooled, pooled).logsumexp(-1).mean()
        return F.cross_entropy(logits, y, label_smoothing=0.1) + extra


def _inputs():
    g = torch.Generator().manual_seed(3)
    return [torch.randn(2, 3, 8, 8, generator=g), torch.randint(0, 5, (2,), generator=g)]


def _model():
    torch.manual_seed(0)
    return CompositeOps()


def _slots(model):
    return [
        Slot(module._parameters, name, f"{prefix}.{name}".lstrip("."))
        for prefix, module in model.named_modules()
        for name, p in module._parameters.items()
        if p is not None
    ]


def _sgd(model):
    return descending(model, model.parameters)


def _cia_entries() -> dict:
    """What torch.export's core table has beyond the one capture uses."""
    full = dict(core_aten_decompositions())
    return {op: fn for op, fn in full.items() if op not in capture._core_aten_table()}


def test_the_table_leaves_out_only_composite_implicit_ops():
    entries = _cia_entries()
    assert entries, "torch.export's table has CIA entries to leave out"
    cia = torch._C.DispatchKey.CompositeImplicitAutograd
    assert all(
        op.has_kernel_for_dispatch_key(cia)
        for op in entries
        if isinstance(op, torch._ops.OpOverload)
    )


def test_a_step_of_composite_ops_captures_the_same_graph_with_their_entries():
    """Given back (on top of capture's table), the CIA entries give the graph captured without
    them. Most CIA ops decompose above the tracer; those that reach it (inside other
    decompositions: softmax, rsub, ...) consult their entry, and without it the tracer's own
    ``op.decompose`` must do the same."""
    called = []

    def spying(op, decomposition):
        def decomposed(*args, **kwargs):
            called.append(str(op))
            return decomposition(*args, **kwargs)

        return decomposed

    entries = {op: spying(op, fn) for op, fn in _cia_entries().items()}
    model = _model()
    lean = capture_step(_sgd(model), _slots(model), _inputs())
    full = capture_step(_sgd(model), _slots(model), _inputs(), decompositions=entries)
    assert called, "no CIA entry was consulted: this step compares nothing"
    assert lean.graph.code == full.graph.code, sorted(set(called))


def test_the_step_matches_eager_torch():
    eager = _model()
    eager_loss = _sgd(eager)(*_inputs())

    model = _model()
    slots = _slots(model)
    captured = capture_step(_sgd(model), slots, _inputs())
    tensors = [s.get() for s in slots]
    used = [dtypes.tensor_to_array(tensors[i].detach()) for i in captured.used_state]
    new_state, outputs = Program(captured)(used, [dtypes.tensor_to_array(x) for x in _inputs()], 0)
    assert float(outputs[0]) == pytest.approx(eager_loss.item(), rel=1e-6)
    eager_params = dict(eager.named_parameters())
    names = [s.name for s in slots]
    for index, value in zip(captured.written_state, new_state):
        torch.testing.assert_close(
            torch.from_numpy(np.array(value)),
            eager_params[names[index]].detach(),
            rtol=1e-5,
            atol=1e-6,
        )
