"""JAX devices and meshes for the backends (no torch here)."""

from __future__ import annotations

import jax


def devices(platform: str | None = None) -> list:
    """The JAX devices of a platform ("cpu", "gpu"), or of the default platform; [] if none."""
    try:
        return list(jax.devices(platform)) if platform else list(jax.devices())
    except RuntimeError:
        return []


def platforms() -> list:
    return sorted({d.platform for d in jax.devices()})
