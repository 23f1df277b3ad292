"""Engine behaviour the Trainer relies on: alternating train and eval steps reuses each
step's program (no recompilation; CSX does not refuse), and the namespace packaging."""

import os
import sys
import warnings

import pytest
import torch

import cstorch
from cstorch.core.compile import RecompilationWarning
from tests import fork_server


@pytest.mark.parametrize("device", ["CPU", "CSX"])
@pytest.mark.slow
def test_switching_between_train_and_eval_reuses_each_mode_program(device):
    cstorch.backend(device)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def train_step(x):
        loss = compiled(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    @cstorch.trace
    @torch.no_grad()
    def eval_step(x):
        return compiled(x)

    x = torch.ones(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecompilationWarning)
        for _ in range(3):
            compiled.train()
            train_step(x)
            compiled.eval()
            evaluated = eval_step(x).materialize()
    assert train_step.trace_count == 1 and eval_step.trace_count == 1
    if device == "CPU":  # eval mode: no dropout, so the output is the eager eval output
        model.state_dict()  # brings the trained weights back to the torch side
        torch.testing.assert_close(evaluated, model(x))


@pytest.mark.slow
def test_a_train_step_called_in_the_other_mode_still_recompiles():
    cstorch.backend("CPU")
    model = torch.nn.Dropout(0.5)
    compiled = cstorch.compile(model)

    @cstorch.trace
    def step(x):
        return compiled(x)

    step(torch.ones(4))
    compiled.eval()
    with pytest.warns(RecompilationWarning, match="train/eval mode"):
        step(torch.ones(4))


def _run(code, *paths):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*paths, *sys.path]))
    return fork_server.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow
def test_modelzoo_is_a_namespace_portion_that_a_real_install_shadows(tmp_path):
    result = _run(
        "import cerebras.modelzoo as m, cerebras.modelzoo.trainer as t; "
        "print(getattr(m, '__file__', None), t.Trainer.__module__)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["None", "cerebras.modelzoo.trainer.trainer"]

    # An installed Model Zoo is a regular package: it wins over this namespace portion.
    real = tmp_path / "site" / "cerebras" / "modelzoo"
    (real / "trainer").mkdir(parents=True)
    (real / "__init__.py").write_text("")
    (real / "trainer" / "__init__.py").write_text("Trainer = 'the real one'\n")
    result = _run(
        "from cerebras.modelzoo.trainer import Trainer; print(Trainer)", str(tmp_path / "site")
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "the real one"
