"""The slow cases of a parametrized test, marked where the cases are written (the fast lane,
`make test-fast`, leaves them out; tests/conftest.py)."""

import pytest


def marked_cases(values, ids, slow):
    """``values`` for ``pytest.mark.parametrize`` with ``ids``, the cases whose id is in
    ``slow`` marked ``slow``. A tuple value fills several argument names. An id in ``slow``
    that names no case is an error, so a renamed case cannot leave its mark behind."""
    values, ids = list(values), list(ids)
    unknown = sorted(set(slow) - set(ids))
    if unknown:
        raise ValueError(f"slow cases {unknown} are not among the cases {ids}")
    return [
        pytest.param(
            *(value if isinstance(value, tuple) else (value,)),
            id=case_id,
            marks=[pytest.mark.slow] if case_id in slow else [],
        )
        for value, case_id in zip(values, ids, strict=True)
    ]
