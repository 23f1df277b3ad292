"""Byte and time unit conversions and human-readable sizes."""

from __future__ import annotations

_POWER_10 = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15}
_POWER_2 = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}
_BYTE_UNITS = {**_POWER_10, **_POWER_2}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _multiplier(table: dict, unit: str, what: str):
    if unit not in table:
        raise ValueError(f"Invalid {what} {unit!r}: expected one of {', '.join(table)}.")
    return table[unit]


def convert_byte_unit(num, tgt_unit: str, src_unit: str = "B", precision: int = 0):
    """``num`` bytes-in-``src_unit`` expressed in ``tgt_unit``, rounded to ``precision`` digits
    (an int when ``precision`` is 0)."""
    value = round(
        num
        * _multiplier(_BYTE_UNITS, src_unit, "src_unit")
        / _multiplier(_BYTE_UNITS, tgt_unit, "tgt_unit"),
        precision,
    )
    return int(value) if precision == 0 else value


def bytes_to_human(num, /, fmt: str = "{value:.1f}{unit}", log_base: int = 2) -> str:
    """``num`` bytes in the largest unit it reaches, e.g. ``1536 -> "1.5KiB"``."""
    if log_base not in (2, 10):
        raise ValueError(f"Invalid log_base {log_base}: expected 2 or 10.")
    table = _POWER_2 if log_base == 2 else _POWER_10
    unit, value = "B", num
    for name, size in reversed(list(table.items())[1:]):
        if num >= size:
            unit, value = name, float(num) / size
            break
    return fmt.format(unit=unit, value=value)


def convert_time_unit(num, tgt_unit: str, src_unit: str = "s", precision: int = 0):
    """``num`` in ``src_unit`` expressed in ``tgt_unit`` (units ns, us, ms, s, m, h, d)."""
    value = round(
        num
        * _multiplier(_TIME_UNITS, src_unit, "src_unit")
        / _multiplier(_TIME_UNITS, tgt_unit, "tgt_unit"),
        precision,
    )
    return int(value) if precision == 0 else value


def time_to_human(seconds, fmt: str = "{value:.1f}{unit}") -> str:
    """``seconds`` in the largest time unit it reaches, e.g. ``90 -> "1.5m"``."""
    unit, value = "s", seconds
    for name in ("d", "h", "m"):
        if seconds >= _TIME_UNITS[name]:
            unit, value = name, seconds / _TIME_UNITS[name]
            break
    return fmt.format(unit=unit, value=value)
