"""``cerebras.appliance.torch_compat``: the Model Zoo 2.10's ``dataclasses.replace`` on a
torch ``TreeSpec`` works where the zoo runs, and nothing changes at ``import cstorch``.

Each case runs in a fresh interpreter: whether the tolerance is installed is process state.
The zoo's own code path (its ``TrainerConfig`` serializer) is exercised by tests/zoo."""

import sys
import textwrap

import pytest

from tests import fork_server

# The call of the zoo's trainer/validate.py (TrainerConfig.replace_tuple_with_list), written
# out here: rebuild every spec with tuples turned into lists.
ZOO_CALL = textwrap.dedent("""
    import dataclasses, json
    from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

    def replace_tuple_with_list(spec):
        if spec.num_children == 0:
            return spec
        children = [replace_tuple_with_list(c) for c in spec.children_specs]
        return dataclasses.replace(spec, type=list if spec.type is tuple else spec.type,
                                   children_specs=children)

    config = {"init": {"betas": (0.9, 0.95), "loop": {"num_steps": 3}},
              "fit": [{"shape": (2, (3, 4))}, None]}
    values, spec = tree_flatten(config)
    try:
        rebuilt = tree_unflatten(values, replace_tuple_with_list(spec))
        print(json.dumps({"ok": rebuilt}))
    except TypeError as error:
        print(json.dumps({"error": str(error)}))
""")


def _run(prelude: str) -> dict:
    import json

    proc = fork_server.run(
        [sys.executable, "-W", "ignore", "-c", prelude + ZOO_CALL],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _torch_needs_it() -> bool:
    from torch.utils._pytree import TreeSpec

    from cerebras.appliance.torch_compat import _needs_tolerance

    return _needs_tolerance(TreeSpec)


@pytest.mark.slow
def test_the_zoo_call_works_once_the_zoo_facing_package_is_imported():
    result = _run("import cerebras.appliance.utils.classes\n")
    assert result == {
        "ok": {
            "init": {"betas": [0.9, 0.95], "loop": {"num_steps": 3}},
            "fit": [{"shape": [2, [3, 4]]}, None],
        }
    }


@pytest.mark.slow
def test_import_cstorch_changes_nothing_in_torch():
    if not _torch_needs_it():
        pytest.skip("this torch's TreeSpec takes its field names already")
    result = _run("import cstorch, cerebras.pytorch\n")
    assert "_context" in result["error"]


@pytest.mark.slow
def test_treespec_keeps_its_own_constructor_and_equality():
    script = textwrap.dedent("""
        import dataclasses
        from cerebras.appliance import torch_compat
        from torch.utils._pytree import LeafSpec, TreeSpec, tree_flatten
        torch_compat.install(); torch_compat.install()   # idempotent
        leaf = LeafSpec()
        a = TreeSpec(tuple, None, [leaf, leaf])
        b = TreeSpec(type=tuple, context=None, children_specs=[leaf, leaf])
        c = dataclasses.replace(a)
        d = dataclasses.replace(a, type=list)
        assert a == b == c == tree_flatten((1, 2))[1], (a, b, c)
        assert d == tree_flatten([1, 2])[1] and d.num_leaves == 2
        keyed = dataclasses.replace(tree_flatten({"x": 1})[1], children_specs=[leaf])
        assert keyed == tree_flatten({"x": 5})[1]
        print("ok")
    """)
    proc = fork_server.run(
        [sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
