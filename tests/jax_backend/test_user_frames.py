"""``jax_backend.user_frames``: a warning raised deep in the libraries names the user's line."""

from __future__ import annotations

import functools
import warnings

import jax

from jax_backend import user_frames


def test_a_warning_raised_inside_jax_tracing_names_the_users_line():
    """A lowering runs inside JAX's tracing: JAX's frames are skipped like the engine's, so
    the warning points here, not at a line of JAX."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        jax.eval_shape(functools.partial(user_frames.warn, "from inside a trace"))
    (warning,) = record
    assert warning.filename == __file__ and str(warning.message) == "from inside a trace"
