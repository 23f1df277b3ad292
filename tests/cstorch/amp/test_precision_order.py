"""Mixed precision is the user's choice whichever comes first, the choice or the backend
(issue 44, item 8): ``enable_mixed_precision(False)`` before ``cstorch.backend("CSX")`` used to
be undone by the backend (the run said "mixed float16"). Without a choice CSX trains in
float16 mixed precision; the numbers are checked against eager torch."""

import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.backend import precision
from cstorch.utils.progress import run_header

pytestmark = pytest.mark.core

BATCHES = [
    (
        torch.randn(8, 16, generator=torch.Generator().manual_seed(i)),
        torch.randn(8, 4, generator=torch.Generator().manual_seed(100 + i)),
    )
    for i in range(3)
]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _eager_torch_losses():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in BATCHES:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _csx_losses(before=(), after=()):
    """Losses of three CSX steps, with the precision calls ``before`` and ``after`` the
    backend is created; also the run header's precision."""
    for call in before:
        call()
    backend = cstorch.backend("CSX")
    for call in after:
        call()
    model = _model()
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    losses = []

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    for x, y in BATCHES:
        losses.append(step(x, y).item())
    header = run_header(backend._impl, None, None, None)
    return losses, header


def _fp32_off():
    cstorch.amp.enable_mixed_precision(False)


@pytest.mark.parametrize("when", ["before", "after"])
def test_float32_on_csx_holds_whether_chosen_before_or_after_the_backend(when):
    losses, header = _csx_losses(**{when: [_fp32_off]})
    assert "float32" in header and "mixed" not in header
    assert not precision.mixed_precision()
    torch.testing.assert_close(losses, _eager_torch_losses(), rtol=1e-6, atol=0)


def test_csx_defaults_to_float16_mixed_precision():
    losses, header = _csx_losses()
    assert "mixed float16" in header and cstorch.amp.get_half_dtype() == torch.float16
    reference = _eager_torch_losses()
    # float16 matmuls: near float32, but measurably not it (the test sees the difference).
    torch.testing.assert_close(losses, reference, rtol=1e-2, atol=0)
    assert max(abs(a - b) / abs(b) for a, b in zip(losses, reference)) > 1e-5


@pytest.mark.parametrize("when", ["before", "after"])
def test_half_dtype_chosen_before_or_after_csx_holds(when):
    _, header = _csx_losses(**{when: [lambda: cstorch.amp.set_half_dtype("bfloat16")]})
    assert "mixed bfloat16" in header


def test_a_choice_of_half_dtype_then_float32_before_csx_is_float32():
    losses, header = _csx_losses(before=[lambda: cstorch.amp.set_half_dtype("bfloat16"), _fp32_off])
    assert "float32" in header and cstorch.amp.get_half_dtype() == torch.bfloat16
    torch.testing.assert_close(losses, _eager_torch_losses(), rtol=1e-6, atol=0)


def test_use_bfloat16_keeps_the_backend_default_and_a_torn_down_csx_leaves_none():
    cstorch.amp.use_bfloat16(True)  # picks the half dtype, chooses nothing about mixed
    _, header = _csx_losses()
    assert "mixed bfloat16" in header
    cstorch.backend._reset_for_tests()
    assert not precision.mixed_precision()  # the next backend (CPU) starts in float32
