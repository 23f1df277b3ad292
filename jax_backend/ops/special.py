"""Special functions that torch keeps as single ATen ops (``torch.special``, polygamma,
incomplete gamma, orthogonal polynomials). Integer inputs compute in float32, as in torch.

The orthogonal polynomials take the degree ``n`` as a tensor; they run torch's three-term
recurrences in a ``lax.while_loop`` up to the largest degree present, so the graph stays
static while the trip count follows the data.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from jax_backend.ops._common import as_float, promote_to_float
from jax_backend.registry import lowers

aten = torch.ops.aten
jss = jax.scipy.special


_ZETA_A = (
    12.0,
    -720.0,
    30240.0,
    -1209600.0,
    47900160.0,
    -1.8924375803183791606e9,
    7.47242496e10,
    -2.950130727918164224e12,
    1.1646782814350067249e14,
    -4.5979787224074726105e15,
    1.8152105401943546773e17,
    -7.1661652561756670113e18,
)
_MACHEP = 1.11022302462515654042e-16


def _zeta(x, q):
    """Hurwitz zeta by Cephes' Euler-Maclaurin summation, as ATen computes it (negative
    non-integer q included, which jax.scipy.special.zeta does not cover)."""
    dtype = x.dtype
    one = jnp.ones((), dtype)
    special = jnp.where(x == 1, jnp.inf, jnp.where(x < 1, jnp.nan, 0)).astype(dtype)
    special = jnp.where((q <= 0) & (q == jnp.floor(q)) & (x > 1), jnp.inf, special)
    special = jnp.where(
        (q <= 0) & (q != jnp.floor(q)) & (x != jnp.floor(x)) & (x > 1), jnp.nan, special
    )
    is_special = (x <= 1) | ((q <= 0) & ((q == jnp.floor(q)) | (x != jnp.floor(x))))
    large = q > 1e8
    asymptotic = (one / (x - 1) + one / (2 * q)) * jnp.power(q, 1 - x)

    def active(state):
        i, a, _, _, done, _ = state
        return ~done & ((i < 9) | (a <= 9))

    def body(state):
        i, a, b, s, done, result = state
        go = active(state)
        a2 = jnp.where(go, a + 1, a)
        b2 = jnp.where(go, jnp.power(a2, -x), b)
        s2 = jnp.where(go, s + b2, s)
        converged = go & (-_MACHEP * s2 < b2) & (b2 < _MACHEP * s2)
        return (
            jnp.where(go, i + 1, i),
            a2,
            b2,
            s2,
            done | converged,
            jnp.where(converged, s2, result),
        )

    start = (
        jnp.zeros(x.shape, jnp.int32),
        q,
        jnp.zeros_like(q),
        jnp.power(q, -x),
        is_special | large,
        jnp.zeros_like(q),
    )
    _, a, b, s, done, result = lax.while_loop(lambda st: jnp.any(active(st)), body, start)
    w = a
    s = s + b * w / (x - 1) - 0.5 * b
    a, k = one, jnp.zeros((), dtype)
    for coefficient in _ZETA_A:
        a = a * (x + k)
        b = b / w
        t = a * b / coefficient
        s_new = s + t
        converged = ~done & (jnp.abs(t / s_new) < _MACHEP)
        result = jnp.where(converged, s_new, result)
        done = done | converged
        s = s_new
        k = k + 1
        a = a * (x + k)
        b = b / w
        k = k + 1
    result = jnp.where(done, result, s)
    return jnp.where(is_special, special, jnp.where(large, asymptotic, result))


def _trigamma(x):
    reflect = x < 0.5
    sin_pi_x = jnp.sin(math.pi * x)
    result = jnp.where(reflect, -(math.pi * math.pi) / (sin_pi_x * sin_pi_x), 0).astype(x.dtype)
    x = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x
    return jnp.where(reflect, -result, result)


@lowers(aten.polygamma.default)
def aten_polygamma(n, x):
    x = as_float(x)
    if n == 0:
        return jss.digamma(x)
    if n == 1:
        return _trigamma(x)
    factor = (1.0 if n % 2 else -1.0) * math.exp(math.lgamma(n + 1.0))
    return factor * _zeta(jnp.full_like(x, n + 1), x)


@lowers(aten.special_zeta.default, aten.special_zeta.other_scalar, aten.special_zeta.self_scalar)
def aten_special_zeta(x, q):
    x, q = promote_to_float(x, q)
    x, q = jnp.broadcast_arrays(x, q)
    return _zeta(x, q)


@lowers(aten.igamma.default)
def aten_igamma(a, x):
    a, x = promote_to_float(a, x)
    return jss.gammainc(a, x)


@lowers(aten.igammac.default)
def aten_igammac(a, x):
    a, x = promote_to_float(a, x)
    return jss.gammaincc(a, x)


@lowers(aten.special_modified_bessel_i0.default)
def aten_special_modified_bessel_i0(x):
    return jss.i0(as_float(x))


@lowers(aten.special_modified_bessel_i1.default)
def aten_special_modified_bessel_i1(x):
    return jss.i1(as_float(x))


@lowers(aten.special_spherical_bessel_j0.default)
def aten_special_spherical_bessel_j0(x):
    x = as_float(x)
    safe = jnp.where(x == 0, jnp.ones((), x.dtype), x)
    return jnp.where(
        jnp.isinf(x),
        jnp.zeros((), x.dtype),
        jnp.where(x == 0, jnp.ones((), x.dtype), jnp.sin(safe) / safe),
    )


# ---------------------------------------------------------------- orthogonal polynomials
def _recurrence(x, n, p0, p1, step):
    """Evaluates p_n by p_{k+1} = step(k, p_k, p_{k-1}) for integer-valued n >= 2."""
    n_int = n.astype(jnp.int64)
    top = jnp.max(jnp.where(n_int >= 2, n_int, 1)) if n_int.size else jnp.asarray(1, jnp.int64)
    result = jnp.where(n_int == 0, p0, p1)

    def body(state):
        k, prev, cur, res = state
        nxt = step(k, cur, prev)
        res = jnp.where(n_int == k + 1, nxt, res)
        return k + 1, cur, nxt, res

    def cond(state):
        return state[0] < top

    _, _, _, result = lax.while_loop(cond, body, (jnp.asarray(1, jnp.int64), p0, p1, result))
    return result


def _poly_args(x, n):
    """x as float, n truncated to an integer (torch casts the degree to int64)."""
    x, n = promote_to_float(x, n)
    x, n = jnp.broadcast_arrays(x, jnp.trunc(n))
    return x, n


def _chebyshev(x, n, first):
    ones = jnp.ones_like(x)
    p1 = first(x)
    out = _recurrence(x, n, ones, p1, lambda k, cur, prev: 2 * x * cur - prev)
    return out


@lowers(
    aten.special_chebyshev_polynomial_t.default,
    aten.special_chebyshev_polynomial_t.x_scalar,
    aten.special_chebyshev_polynomial_t.n_scalar,
)
def aten_special_chebyshev_polynomial_t(x, n):
    x, n = _poly_args(x, n)
    out = _chebyshev(x, n, lambda v: v)
    # torch: |x| == 1 closed forms, n > 6 with |x| < 1 via cos(n acos x).
    out = jnp.where((n > 6) & (jnp.abs(x) < 1), jnp.cos(n * jnp.arccos(x)), out)
    out = jnp.where(x == 1, jnp.ones_like(x), out)
    out = jnp.where(x == -1, jnp.where(jnp.fmod(n, 2) == 0, 1.0, -1.0).astype(x.dtype), out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


@lowers(
    aten.special_chebyshev_polynomial_u.default,
    aten.special_chebyshev_polynomial_u.x_scalar,
    aten.special_chebyshev_polynomial_u.n_scalar,
)
def aten_special_chebyshev_polynomial_u(x, n):
    x, n = _poly_args(x, n)
    out = _chebyshev(x, n, lambda v: 2 * v)
    acos = jnp.arccos(x)
    closed = jnp.where(
        jnp.sin(acos) != 0,
        jnp.sin((n + 1) * acos) / jnp.sin(acos),
        (n + 1) * jnp.cos((n + 1) * acos) / jnp.cos(acos),
    )
    out = jnp.where((n > 8) & (jnp.abs(x) < 1), closed, out)
    out = jnp.where(x == 1, n + 1, out)
    out = jnp.where(x == -1, jnp.where(jnp.fmod(n, 2) == 0, n + 1, -(n + 1)), out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


@lowers(
    aten.special_chebyshev_polynomial_v.default,
    aten.special_chebyshev_polynomial_v.x_scalar,
    aten.special_chebyshev_polynomial_v.n_scalar,
)
def aten_special_chebyshev_polynomial_v(x, n):
    x, n = _poly_args(x, n)
    out = _chebyshev(x, n, lambda v: 2 * v - 1)
    half = jnp.arccos(x) / 2
    closed = jnp.where(
        jnp.sin(half) != 1,
        jnp.cos((n + 0.5) * jnp.arccos(x)) / jnp.cos(half),
        jnp.where(jnp.fmod(n, 2) == 0, n + n + 1, -(n + n + 1)),
    )
    out = jnp.where((n > 8) & (jnp.abs(x) < 1), closed, out)
    out = jnp.where(x == 1, jnp.ones_like(x), out)
    out = jnp.where(x == -1, jnp.where(jnp.fmod(n, 2) == 0, n + n + 1, -(n + n + 1)), out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


@lowers(
    aten.special_chebyshev_polynomial_w.default,
    aten.special_chebyshev_polynomial_w.x_scalar,
    aten.special_chebyshev_polynomial_w.n_scalar,
)
def aten_special_chebyshev_polynomial_w(x, n):
    x, n = _poly_args(x, n)
    out = _chebyshev(x, n, lambda v: 2 * v + 1)
    half = jnp.arccos(x) / 2
    closed = jnp.where(
        jnp.cos(half) != 1, jnp.sin((n + 0.5) * jnp.arccos(x)) / jnp.sin(half), n + n + 1
    )
    out = jnp.where((n > 8) & (jnp.abs(x) < 1), closed, out)
    out = jnp.where(x == 1, n + n + 1, out)
    out = jnp.where(x == -1, jnp.where(jnp.fmod(n, 2) == 0, 1.0, -1.0).astype(x.dtype), out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


def _shifted(fn):
    def lowering(x, n):
        x, n = _poly_args(x, n)
        return fn(2 * x - 1, n)

    return lowering


for _kind in "tuvw":
    _packet = getattr(aten, f"special_shifted_chebyshev_polynomial_{_kind}")
    _base = globals()[f"aten_special_chebyshev_polynomial_{_kind}"]
    _fn = _shifted(_base)
    _fn.__name__ = f"aten_special_shifted_chebyshev_polynomial_{_kind}"
    lowers(_packet.default, _packet.x_scalar, _packet.n_scalar)(_fn)


@lowers(
    aten.special_hermite_polynomial_h.default,
    aten.special_hermite_polynomial_h.x_scalar,
    aten.special_hermite_polynomial_h.n_scalar,
)
def aten_special_hermite_polynomial_h(x, n):
    x, n = _poly_args(x, n)
    out = _recurrence(
        x, n, jnp.ones_like(x), 2 * x, lambda k, cur, prev: 2 * x * cur - 2 * k * prev
    )
    return jnp.where(n < 0, jnp.zeros_like(x), out)


@lowers(
    aten.special_hermite_polynomial_he.default,
    aten.special_hermite_polynomial_he.x_scalar,
    aten.special_hermite_polynomial_he.n_scalar,
)
def aten_special_hermite_polynomial_he(x, n):
    x, n = _poly_args(x, n)
    out = _recurrence(x, n, jnp.ones_like(x), x, lambda k, cur, prev: x * cur - k * prev)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


@lowers(
    aten.special_laguerre_polynomial_l.default,
    aten.special_laguerre_polynomial_l.x_scalar,
    aten.special_laguerre_polynomial_l.n_scalar,
)
def aten_special_laguerre_polynomial_l(x, n):
    x, n = _poly_args(x, n)
    out = _recurrence(
        x,
        n,
        jnp.ones_like(x),
        1 - x,
        lambda k, cur, prev: ((2 * k + 1 - x) * cur - k * prev) / (k + 1),
    )
    out = jnp.where(x == 0, jnp.ones_like(x), out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


@lowers(
    aten.special_legendre_polynomial_p.default,
    aten.special_legendre_polynomial_p.x_scalar,
    aten.special_legendre_polynomial_p.n_scalar,
)
def aten_special_legendre_polynomial_p(x, n):
    x, n = _poly_args(x, n)
    out = _recurrence(
        x, n, jnp.ones_like(x), x, lambda k, cur, prev: ((2 * k + 1) * x * cur - k * prev) / (k + 1)
    )
    out = jnp.where(x == 1, jnp.ones_like(x), out)
    out = jnp.where(x == -1, jnp.where(jnp.fmod(n, 2) == 0, 1.0, -1.0).astype(x.dtype), out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)
