"""``SummaryWriter`` and ``SummaryReader``: TensorBoard summaries plus Cerebras tensor
summaries.

The writer is a subclass of ``torch.utils.tensorboard.SummaryWriter`` (as in cerebras-pytorch),
so every ``add_*`` method of torch's writer is there; it adds whole-tensor summaries
(``add_tensor``), saved with ``torch.save`` under the sibling directory
``events.out.csevents.*`` of the event file. The reader reads the event files with
tensorboard's own message types (``event_file``).

Summaries are meant to be written from step closures, where tensors have values.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import time
import warnings
from collections import defaultdict, namedtuple
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional, Union

import torch
from torch.utils import tensorboard as _torch_tensorboard

from cstorch.utils.tensorboard.event_file import read_events
from jax_backend.errors import CstorchRuntimeError

_METADATA = "__metadata__"
_VERSION_KEY = "__version__"
_VERSION = 1.1
_TEXT_SUFFIX = "/text_summary"

ScalarEvent = namedtuple("ScalarEvent", ["wall_time", "step", "value"])
"""One scalar summary: wall time (s), step, value (as TensorBoard's ``ScalarEvent``)."""


@dataclasses.dataclass(frozen=True)
class TensorDescriptor:
    """A tensor summary: the step, the write time (ns since the epoch) and the tensor."""

    step: int
    ns_since_epoch: int
    tensor: torch.Tensor

    @property
    def utctime(self) -> datetime:
        return datetime.utcfromtimestamp(self.ns_since_epoch / 1e9)

    def to_dict(self) -> dict:
        return {"step": self.step, "ns_since_epoch": self.ns_since_epoch, "tensor": self.tensor}

    @staticmethod
    def from_dict(values: dict) -> "TensorDescriptor":
        return TensorDescriptor(**values)


class SummaryWriter(_torch_tensorboard.SummaryWriter):
    """torch's ``SummaryWriter`` plus Cerebras tensor summaries (see the module docstring).

    Args:
        base_step: the base step of summaries (kept as ``self.base_step``).
        *args, **kwargs: torch's ``SummaryWriter`` arguments (``log_dir``, ``comment``,
            ``purge_step``, ``max_queue``, ``flush_secs``, ``filename_suffix``).
    """

    def __init__(self, *args, base_step: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.base_step = base_step
        events_file = Path(self._get_file_writer().event_writer._file_name)
        self.cs_events_dir = events_file.parent / events_file.name.replace(
            "events.out.tfevents.", "events.out.csevents.", 1
        )
        self.cs_events_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = str(self.cs_events_dir.parent)
        metadata = self.cs_events_dir / _METADATA
        if not metadata.exists():
            metadata.write_text(json.dumps({_VERSION_KEY: _VERSION}))

    def add_tensor(self, name: str, tensor: torch.Tensor, step: int) -> None:
        """Saves ``tensor`` as ``<csevents dir>/tensors/<name>/<step>.<time>.pt``."""
        directory = self.cs_events_dir / "tensors" / name
        directory.mkdir(parents=True, exist_ok=True)
        now = time.time_ns()
        stamp = datetime.fromtimestamp(now / 1e9).strftime("%Y-%m-%dT%H:%M:%S.%f")
        descriptor = TensorDescriptor(
            step=int(step), ns_since_epoch=now, tensor=torch.as_tensor(tensor).detach().clone()
        )
        torch.save(descriptor.to_dict(), str(directory / f"{step}.{stamp}.pt"))


def _scalar(value) -> float | None:
    """A ``Summary.Value``'s scalar: its ``simple_value``, or the first float of its tensor
    (torch writes both kinds)."""
    if value.HasField("simple_value"):
        return value.simple_value
    if value.HasField("tensor") and value.tensor.float_val:
        return value.tensor.float_val[0]
    return None


class SummaryReader:
    """Reads the summaries written under ``log_dirs`` (event files and tensor summaries).

    Args:
        log_dirs: a directory (searched recursively), an event file, or a list of them.
        filter: keep only names matching ``<filter>*/<name>``.
    """

    def __init__(self, log_dirs, filter: Optional[str] = None, **kwargs):
        self.filter = filter
        if not isinstance(log_dirs, (list, tuple, set)):
            log_dirs = [log_dirs]
        roots = [Path(d) for d in log_dirs]
        files = [
            f
            for root in roots
            for f in (root.rglob("events.out.tfevents.*") if root.is_dir() else [root])
            if f.is_file()
        ]
        if not files:
            raise CstorchRuntimeError(f"No event files found under {list(map(str, log_dirs))}.")
        directories = sorted({f.parent.resolve() for f in files})
        common = Path(os.path.commonpath([str(d) for d in directories]))
        self.event_file_dirs = {str(d.relative_to(common)): str(d) for d in directories}
        self.summary_dirs = []
        for root in roots:
            candidates = (
                [root]
                if fnmatch.fnmatch(root.name, "events.out.csevents.*")
                else root.rglob("events.out.csevents.*")
                if root.is_dir()
                else []
            )
            for directory in candidates:
                if not directory.is_dir():
                    continue
                metadata = directory / _METADATA
                if not metadata.exists():
                    raise FileNotFoundError(
                        f"Could not detect the version of the Cerebras "
                        f"summaries in {directory} (no {_METADATA} file)."
                    )
                version = json.loads(metadata.read_text()).get(_VERSION_KEY)
                if version != _VERSION:
                    warnings.warn(
                        f"Skipping Cerebras summaries of unknown version {version} in {directory}.",
                        stacklevel=2,
                    )
                    continue
                if (directory / "tensors").exists():
                    self.summary_dirs.append(directory / "tensors")
        self._runs: Optional[dict] = None

    # ------------------------------------------------------------------ event files
    def reload(self) -> None:
        """Re-reads every event file."""
        runs = {}
        for run, directory in self.event_file_dirs.items():
            scalars, texts = defaultdict(list), defaultdict(list)
            for path in sorted(Path(directory).glob("events.out.tfevents.*")):
                for event in read_events(str(path)):
                    for value in event.summary.value:
                        scalar = _scalar(value)
                        if value.HasField("tensor") and value.tag.endswith(_TEXT_SUFFIX):
                            texts[value.tag].append(
                                (
                                    event.wall_time,
                                    event.step,
                                    [s.decode() for s in value.tensor.string_val],
                                )
                            )
                        elif scalar is not None:
                            scalars[value.tag].append(
                                ScalarEvent(event.wall_time, event.step, scalar)
                            )
            runs[run] = {"scalars": dict(scalars), "text": dict(texts)}
        self._runs = runs

    def _loaded(self) -> dict:
        if self._runs is None:
            self.reload()
        return self._runs

    def _pattern(self, name: str) -> str:
        return f"{self.filter}*/{name}" if self.filter else name

    def _matching(self, kind: str, name: str) -> dict:
        pattern = self._pattern(name)
        return {
            run: [tag for tag in data[kind] if fnmatch.fnmatch(tag, pattern)]
            for run, data in self._loaded().items()
        }

    def Tags(self) -> dict:
        """Run -> {"scalars": [...], "tensors": [...]} (text summaries are tensors)."""
        return {
            run: {"scalars": sorted(data["scalars"]), "tensors": sorted(data["text"])}
            for run, data in self._loaded().items()
        }

    def read_scalar(self, name: str, step: Optional[int] = None):
        """All ``ScalarEvent``s of ``name``, or the one at ``step`` (KeyError if absent)."""
        matches = self._matching("scalars", name)
        if not any(matches.values()):
            raise CstorchRuntimeError(
                f"Could not find scalar {name!r}. Valid scalar names:\n"
                f"{sorted(self.scalar_names())}"
            )
        events = [
            event
            for run, tags in matches.items()
            for tag in tags
            for event in self._runs[run]["scalars"][tag]
        ]
        if step is None:
            return events
        for event in events:
            if event.step == step:
                return event
        raise KeyError(f"Could not find scalar {name!r} at step {step}.")

    def Scalars(self, name: str):
        """Alias of ``read_scalar(name)``."""
        return self.read_scalar(name)

    def scalar_names(self) -> set:
        return {tag for tags in self._matching("scalars", "*").values() for tag in tags}

    def scalar_groups(self) -> set:
        return {name.partition("/")[0] for name in self.scalar_names()}

    def text_summary_names(self) -> set:
        return {
            tag[: -len(_TEXT_SUFFIX)]
            for tags in self._matching("text", "*" + _TEXT_SUFFIX).values()
            for tag in tags
        }

    def read_text_summary(self, name: str, step: Optional[int] = None):
        """The texts of text summary ``name``: a list of ``(wall_time, step, [str])``, or the
        strings at ``step``."""
        matches = self._matching("text", name + _TEXT_SUFFIX)
        entries = [
            entry
            for run, tags in matches.items()
            for tag in tags
            for entry in self._runs[run]["text"][tag]
        ]
        if not entries:
            raise CstorchRuntimeError(
                f"Could not find text summary {name!r}. Valid names:\n"
                f"{sorted(self.text_summary_names())}"
            )
        if step is None:
            return entries
        for _, entry_step, strings in entries:
            if entry_step == step:
                return strings
        raise KeyError(f"Could not find text summary {name!r} at step {step}.")

    # ------------------------------------------------------------------ tensors
    def tensor_names(self) -> set:
        pattern = f"{self.filter}*/**" if self.filter else "**"
        return {
            str(sub.relative_to(directory))
            for directory in self.summary_dirs
            for sub in directory.glob(pattern)
            if sub.is_dir() and not any(child.is_dir() for child in sub.iterdir())
        }

    def read_tensor(
        self, name: str, step: Optional[int] = None, latest_only: bool = True
    ) -> Union[TensorDescriptor, List[TensorDescriptor], Dict, None]:
        """Tensor summaries of ``name``: at ``step`` (the latest, or all sorted by time if not
        ``latest_only``), or a dict step -> those for every step. None (with a warning) if
        there are none."""
        pattern = f"{self._pattern(name)}/{step if step is not None else '*'}.*.pt"
        found = defaultdict(list)
        for directory in self.summary_dirs:
            for path in directory.glob(pattern):
                descriptor = TensorDescriptor.from_dict(torch.load(str(path), weights_only=True))
                found[descriptor.step].append(descriptor)
        if not found:
            warnings.warn(
                f"No tensor named {name!r} has been summarized"
                + (f" at step {step}" if step is not None else "")
                + ".",
                stacklevel=2,
            )
            return None

        def pick(descriptors):
            if latest_only:
                return max(descriptors, key=lambda d: d.ns_since_epoch)
            return sorted(descriptors, key=lambda d: d.ns_since_epoch)

        if step is not None:
            return pick(found[step])
        return {s: pick(d) for s, d in found.items()}
