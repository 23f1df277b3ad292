"""Readable names of the backend's state tensors, from their paths in the state view.

``model0.blocks.0.fc.weight``, ``optimizer0.state.3.exp_avg``, ``optimizer0.group.0.lr``,
``scheduler0.last_epoch``: what ``cstorch.export`` writes in its manifest and what
``TracedStep.pure_state`` names its arrays by.
"""

from __future__ import annotations


def state_name(path: tuple) -> str:
    """The readable unique name of the state at ``path`` (see the module docstring)."""
    kind, index, *rest = path
    if kind == "model":
        module, _, name = rest
        return f"model{index}." + (f"{module}.{name}" if module else name)
    flat = []
    for part in rest:
        flat.extend(part if isinstance(part, tuple) else (part,))
    return ".".join([f"{kind}{index}"] + [str(p) for p in flat])
