"""Python-number arithmetic on a step's runtime scalars (``jax_backend.scalars``): the
``operator.sub`` of ``1 - beta1``, ``torch.sym_float``, ... JAX's weak types carry a Python
number's promotion through them."""

from __future__ import annotations

from jax_backend.registry import lowers
from jax_backend.scalars import FUNCTIONS

for _name, (_python, _jax) in FUNCTIONS.items():
    lowers(_python)(_jax)
