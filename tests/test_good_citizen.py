"""Importing the project changes nothing in the user's process, and a backend's own settings
end with it (issue 26): JAX's config, the environment, torch's functions and the import
system are as they were; JAX-native code keeps float32 defaults while a cstorch step in the
same process keeps torch's int64/float64."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.paths import REPO as ROOT

pytestmark = pytest.mark.slow  # fresh Python processes


# Run in a fresh interpreter: this test process has imported everything already.
IMPORTS = textwrap.dedent("""
    import importlib, json, os, sys
    import jax, jax.numpy as jnp, torch

    def snapshot():
        return {"jax": {k: repr(v) for k, v in jax.config.values.items()},
                "env": dict(os.environ),
                "set_rng_state": id(torch.set_rng_state) + id(torch.random.set_rng_state),
                "meta_path": [repr(f) for f in sys.meta_path]}

    before = snapshot()
    path_finder = [repr(f) for f in sys.meta_path].index(
        repr(importlib.machinery.PathFinder))
    for name in sys.argv[1:]:
        importlib.import_module(name)
    after = snapshot()
    kept = [f for f in after["meta_path"] if f in before["meta_path"]]
    print(json.dumps({
        "jax": {k: (before["jax"].get(k), v) for k, v in after["jax"].items()
                if before["jax"].get(k) != v},
        "env": sorted(k for k in set(before["env"]) | set(after["env"])
                      if before["env"].get(k) != after["env"].get(k)),
        "set_rng_state": before["set_rng_state"] == after["set_rng_state"],
        "meta_path_order_kept": kept == before["meta_path"],
        "meta_path_before_path_finder_kept":
            after["meta_path"][:path_finder] == before["meta_path"][:path_finder],
        "ones_dtype": str(jnp.ones(2).dtype),
        "x64": bool(jax.config.jax_enable_x64),
    }))
""")


def _run(script, *args, env=None):
    env = dict(
        os.environ if env is None else env,
        PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "compat")]),
    )
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "packages",
    [
        ["jax_backend"],
        ["cstorch"],
        ["cerebras.pytorch"],
        ["cerebras_pytorch"],
        ["cerebras_pytorch.experimental", "modelzoo.common.pytorch", "cerebras.modelzoo.trainer"],
    ],
)
def test_importing_changes_nothing_outside_the_project(packages):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_WAIT_POLICY", "JAX_ENABLE_X64", "CSTORCH_COMPILATION_CACHE")
    }
    result = _run(IMPORTS, *packages, env=env)
    assert result["jax"] == {}, f"jax.config changed: {result['jax']}"
    assert result["env"] == [], f"environment changed: {result['env']}"
    assert result["set_rng_state"], "torch.set_rng_state was replaced"
    assert result["meta_path_order_kept"] and result["meta_path_before_path_finder_kept"]
    assert result["ones_dtype"] == "float32" and not result["x64"]


STEP = textwrap.dedent("""
    import json, os, sys
    import jax, jax.numpy as jnp, numpy as np, torch
    import cstorch

    user_cache = jax.config.jax_compilation_cache_dir
    backend = cstorch.backend("CPU")
    cache_while_held = jax.config.jax_compilation_cache_dir
    model = torch.nn.Linear(3, 2).double()
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    counter = torch.zeros((), dtype=torch.int64)

    @cstorch.trace
    def step(x, labels):
        loss = torch.nn.functional.cross_entropy(compiled(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss, labels * 3, (labels.sum() + 2 ** 40)

    x = torch.randn(4, 3, dtype=torch.float64)
    labels = torch.tensor([0, 1, 1, 0])
    loss, tripled, big = step(x, labels)
    user_array = jnp.asarray(np.arange(3, dtype=np.int64))   # the user's own JAX code
    user_jit = jax.jit(lambda a: a * 2)(np.ones(2))
    cstorch.backend._reset_for_tests()
    print(json.dumps({
        "loss": str(loss.dtype), "tripled": str(tripled.dtype), "big": int(big),
        "params": str(model.weight.dtype), "user_array": str(user_array.dtype),
        "user_jit": str(user_jit.dtype), "x64": bool(jax.config.jax_enable_x64),
        "user_cache": user_cache, "cache_while_held": cache_while_held,
        "cache_after": jax.config.jax_compilation_cache_dir,
    }))
""")


def test_a_step_keeps_torch_dtypes_while_user_jax_keeps_its_defaults(tmp_path):
    result = _run(STEP, env=dict(os.environ, CSTORCH_COMPILATION_CACHE=str(tmp_path / "xla")))
    assert (result["loss"], result["tripled"], result["params"]) == (
        "torch.float64",
        "torch.int64",
        "torch.float64",
    )
    assert result["big"] == 2 + 2**40  # an int64 value past int32's range, exactly
    assert result["user_array"] == "int32" and result["user_jit"] == "float32"
    assert not result["x64"]
    # The engine's compilation cache is on while the backend lives, and JAX's setting is
    # put back when it is torn down.
    assert result["user_cache"] is None and result["cache_after"] is None
    assert result["cache_while_held"] == str(tmp_path / "xla")
    assert any(name.startswith("jit_pure_step") for name in os.listdir(tmp_path / "xla"))


def test_a_cache_directory_the_user_chose_is_kept(tmp_path):
    script = (
        "import jax; jax.config.update('jax_compilation_cache_dir', %r)\n" % str(tmp_path / "mine")
    ) + STEP
    result = _run(script, env=dict(os.environ, CSTORCH_COMPILATION_CACHE=str(tmp_path / "x")))
    assert result["cache_while_held"] == result["cache_after"] == str(tmp_path / "mine")
    assert not (tmp_path / "x").exists()


def test_one_cycle_warns_nothing_in_a_jax_users_process():
    """A JAX user's process has no float64: the schedule compares steps without asking for it
    (it once did, and JAX warned on every call), and gives torch's values at the phase ends."""
    import warnings

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from jax_backend import schedules

    assert not jax.config.jax_enable_x64  # as in a user's process
    schedule = schedules.one_cycle(0.01, 0.1, total_steps=25, pct_start=0.3, three_phase=True)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.01)
    ref = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=0.1, total_steps=25, pct_start=0.3, three_phase=True, div_factor=10.0
    )
    expected = []
    for _ in range(25):
        expected.append(opt.param_groups[0]["lr"])
        opt.step()
        ref.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = [float(schedule(jnp.asarray(t))) for t in range(25)]
        got_jit = [float(jax.jit(schedule)(jnp.asarray(t))) for t in range(25)]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    np.testing.assert_allclose(got_jit, expected, rtol=1e-5)
