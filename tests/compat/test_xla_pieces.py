"""The two PyTorch/XLA pieces the 1.6 Model Zoo imports on a CS system
(``cerebras_pytorch.lazy.xla_pieces``): importable only during a 1.x appliance run, and never
visible to ``find_spec("torch_xla")`` otherwise (transformers, accelerate and torch change
behaviour when they find one)."""

import importlib.util
import sys
import textwrap

import pytest
import torch

import cstorch
from tests import fork_server

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is not None,
    reason="a real torch_xla is importable here: it, not the 1.6 pieces, is what imports",
)


def _start_appliance_run(tmp_path):
    import cerebras_pytorch as cbtorch

    cbtorch.initialize(service_workdir=str(tmp_path), appliance=True)
    return cbtorch


def _nothing_of_torch_xla():
    assert importlib.util.find_spec("torch_xla") is None
    assert not any(name == "torch_xla" or name.startswith("torch_xla.") for name in sys.modules)
    with pytest.raises(ModuleNotFoundError, match="torch_xla"):
        import torch_xla  # noqa: F401


def test_nothing_before_the_appliance_run_and_nothing_after_it(tmp_path):
    from cerebras_pytorch.core import cb_model as cm

    import cerebras_pytorch.lazy.xla_pieces  # noqa: F401  (importing it serves nothing)

    _nothing_of_torch_xla()
    _start_appliance_run(tmp_path)
    assert cm.use_cs()
    assert importlib.util.find_spec("torch_xla") is not None
    import torch_xla.utils.utils  # noqa: F401

    cstorch.config.reset()  # the run is over
    _nothing_of_torch_xla()


def test_the_two_pieces_the_16_zoo_imports(tmp_path):
    _start_appliance_run(tmp_path)
    # fc_mnist's data functions on a CS system
    import torch_xla.utils.utils as xu

    batch = (torch.zeros(4, 1, 28, 28), torch.zeros(4, dtype=torch.int32))
    samples = xu.SampleGenerator(data=batch, sample_count=3)
    assert len(samples) == 3
    for _ in range(2):  # each iteration starts over
        got = list(samples)
        assert len(got) == 3 and all(item is batch for item in got)
    assert list(xu.SampleGenerator(batch, 0)) == []
    with pytest.raises(ValueError, match="sample_count"):
        xu.SampleGenerator(batch, -1)

    # the appliance runner before an eval is traced: `import torch_xla`, then the attribute
    import torch_xla

    assert torch_xla._XLAC._xla_set_parameter_name(torch.zeros(2), "model.fc.weight") is None
    with pytest.raises(TypeError, match="tensor"):
        torch_xla._XLAC._xla_set_parameter_name([0.0], "model.fc.weight")
    with pytest.raises(TypeError, match="name"):
        torch_xla._XLAC._xla_set_parameter_name(torch.zeros(2), 3)
    assert torch_xla.utils.utils is xu
    assert "not PyTorch/XLA" in torch_xla.__doc__


def test_nothing_else_of_pytorch_xla_during_the_run(tmp_path):
    """The 1.6 zoo's own TPU check (``find_spec("torch_xla.core")``) must answer no."""
    _start_appliance_run(tmp_path)
    assert importlib.util.find_spec("torch_xla") is not None
    assert importlib.util.find_spec("torch_xla.core") is None
    for name in (
        "torch_xla.core.xla_model",
        "torch_xla.distributed.spmd",
        "torch_xla.runtime",
        "torch_xla.utils.dlpack",
    ):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(name)


def test_the_1x_loader_iterates_a_sample_generator(tmp_path):
    cbtorch = _start_appliance_run(tmp_path)
    import torch_xla.utils.utils as xu

    batch = (torch.ones(2, 3), torch.zeros(2, dtype=torch.int32))
    loader = cbtorch.dataloader(xu.SampleGenerator(batch, 4))
    assert len(loader) == 4
    got = list(loader)
    assert len(got) == 4 and all(
        torch.equal(x, batch[0]) and y.dtype == torch.int32 for x, y in got
    )


def test_a_real_torch_xla_earlier_on_the_path_wins(tmp_path, monkeypatch):
    real = tmp_path / "site" / "torch_xla"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    try:
        _start_appliance_run(tmp_path)
        import torch_xla

        assert torch_xla.REAL and torch_xla.__file__ == str(real / "__init__.py")
        cstorch.config.reset()
        assert sys.modules["torch_xla"] is torch_xla  # withdrawing forgets only its own
    finally:
        sys.modules.pop("torch_xla", None)


@pytest.mark.slow
def test_a_plain_process_finds_no_torch_xla(tmp_path):
    """Importing every name of this project (and the 1.x lazy API) serves no torch_xla:
    transformers, imported after them, sees none."""
    script = textwrap.dedent("""
        import importlib.util
        import cerebras.pytorch, cerebras_pytorch, cerebras_pytorch.experimental
        import cerebras_pytorch.lazy, cerebras_pytorch.lazy.api, cerebras_pytorch.lazy.xla_pieces
        import cerebras_appliance, modelzoo.common.pytorch, cstorch
        from cerebras_pytorch.core import cb_model
        assert not cb_model.use_cs()
        assert importlib.util.find_spec("torch_xla") is None
        import transformers
        from transformers.utils import import_utils
        assert not import_utils.is_torch_xla_available()
        assert importlib.util.find_spec("torch_xla") is None
        try:
            import torch_xla
        except ModuleNotFoundError:
            print("no torch_xla")
    """)
    proc = fork_server.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("no torch_xla")
