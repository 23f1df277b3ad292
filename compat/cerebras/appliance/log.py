"""Logging helpers of ``cerebras.appliance``: the ``cerebras`` logger tree, the VERBOSE and
TRACE levels, per-class loggers (``named_class_logger``) and the (local) settings of the
wafer-scale-cluster server loggers."""

from __future__ import annotations

import dataclasses
import logging
from typing import ClassVar, List, Literal, Optional, Protocol, Type, TypeVar, Union

ROOTNAME = "cerebras"
VERBOSE = logging.INFO - 5
TRACE = logging.DEBUG - 5
logging.addLevelName(VERBOSE, "VERBOSE")
logging.addLevelName(TRACE, "TRACE")

logger = logging.getLogger(ROOTNAME)
wsc_logger = logger.getChild("wsc")

_MODES = ("compile", "execute")
_ROLES = ("crd", "wrk", "wgt", "act", "cmd", "br", "chf")


def get_level_name(level: Union[int, str]) -> Union[int, str]:
    """The number of a level name or the name of a level number (VERBOSE and TRACE included)."""
    if isinstance(level, str):
        level = level.upper()
    return logging.getLevelName(level)


class ClassLogger(Protocol):
    """A class decorated with ``named_class_logger``: it has a ``logger`` class attribute."""

    logger: ClassVar[logging.Logger]


_T = TypeVar("_T")


def _attach(cls, name: Optional[str]):
    cls.logger = logging.getLogger(f"{ROOTNAME}.{name or cls.__qualname__}")
    for method, level in (
        ("_should_log_info", logging.INFO),
        ("_should_log_verbose", VERBOSE),
        ("_should_log_debug", logging.DEBUG),
        ("_should_log_trace", TRACE),
    ):
        setattr(cls, method, classmethod(lambda c, level=level: c.logger.isEnabledFor(level)))
    return cls


def named_class_logger(cls_or_namespace: Union[Type[_T], str, None] = None):
    """Class decorator (bare, or with a logger name) giving the class a ``logger``."""
    if isinstance(cls_or_namespace, type):
        return _attach(cls_or_namespace, None)
    if cls_or_namespace is None or isinstance(cls_or_namespace, str):
        return lambda cls: _attach(cls, cls_or_namespace)
    raise TypeError(
        f"named_class_logger takes a class, a logger name or nothing, got "
        f"{type(cls_or_namespace).__name__}."
    )


@dataclasses.dataclass
class WscLogSetting:
    """The level of one cluster-server logger (``wsc_logger.<mode>.<role>.<tag>``)."""

    level: int
    tag: Optional[str] = None
    mode: Optional[Literal["compile", "execute"]] = None
    role: Optional[Literal["crd", "wrk", "wgt", "act", "cmd", "br", "chf"]] = None

    def __post_init__(self):
        if not isinstance(self.level, int) or self.level <= logging.NOTSET:
            raise ValueError(f"level must be an integer above {logging.NOTSET}, got {self.level}.")
        if self.mode is not None and self.mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {self.mode!r}.")
        if self.role is not None and self.role not in _ROLES:
            raise ValueError(f"role must be one of {_ROLES}, got {self.role!r}.")


def collect_wsc_log_settings() -> List[WscLogSetting]:
    """The levels set on ``wsc_logger`` and its children, least specific first.

    Names that do not follow ``<mode>.<role>.<tag>`` (each part optional, order kept) are
    ignored with a warning, as they would be by a real cluster.
    """
    settings = []
    prefix = wsc_logger.name
    names = [prefix] + sorted(
        n for n in logging.root.manager.loggerDict if n.startswith(prefix + ".")
    )
    for name in names:
        lg = logging.getLogger(name)
        if lg.level == logging.NOTSET:
            continue
        parts = name[len(prefix) + 1 :].split(".") if name != prefix else []
        mode = parts.pop(0) if parts and parts[0] in _MODES else None
        role = parts.pop(0) if parts and parts[0] in _ROLES else None
        if len(parts) > 1:
            logger.warning(
                f"Ignoring cluster-server log setting {name!r}: expected "
                f"{prefix}.<mode>.<role>.<tag>."
            )
            continue
        settings.append(WscLogSetting(lg.level, parts[0] if parts else None, mode, role))
    settings.sort(key=lambda s: (s.mode is not None, s.role is not None, s.tag is not None))
    return settings
