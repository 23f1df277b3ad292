"""``Compression``: marks parameters and buffers to be stored in an MX compression format.

On a Cerebras system the compiler stores the marked tensors compressed (see
https://arxiv.org/abs/2310.10537); here the marks are recorded (``compression_format``) and
have no effect on the computed numbers. Marks are not saved in checkpoints: apply the
compression again after ``load_state_dict``.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
import typing
from typing import List, Literal, Optional, Union

import torch

from jax_backend.errors import CstorchTypeError, CstorchValueError

FormatLiteral = Literal["mx8", "mx8-e3m4", "mx8-e4m3", "mx9", "mx10", "mx10-e2m7"]
_FORMATS = typing.get_args(FormatLiteral)

_annotations = torch.utils.weak.WeakIdKeyDictionary()  # tensor -> format


def compression_format(tensor: torch.Tensor) -> Optional[str]:
    """The compression format ``tensor`` was annotated with, or None."""
    return _annotations.get(tensor)


class Compression:
    """Annotates the parameters/buffers matching ``param_filter`` with ``format``.

    Args:
        format: one of "mx8", "mx8-e3m4", "mx8-e4m3", "mx9", "mx10", "mx10-e2m7".
        param_filter: glob pattern(s) over parameter and buffer names.
    """

    def __init__(self, format: FormatLiteral, param_filter: Union[str, List[str]]):
        if not isinstance(format, str):
            raise CstorchTypeError(f"Expected format to be a string, but got type {type(format)}.")
        if format not in _FORMATS:
            raise CstorchValueError(f"Expected format to be one of {_FORMATS}, but got {format!r}.")
        self.format = format
        patterns = [param_filter] if isinstance(param_filter, str) else list(param_filter)
        self.param_filter = [re.compile(fnmatch.translate(p)) for p in patterns]
        self.compress_tensors = torch.utils.weak.WeakIdKeyDictionary()

    def apply(self, module: torch.nn.Module) -> None:
        """Selects the matching tensors of ``module`` and annotates them before every
        forward."""
        if not isinstance(module, torch.nn.Module):
            raise CstorchTypeError(f"Expected torch.nn.Module but got {type(module).__name__}.")
        for name, tensor in itertools.chain(module.named_parameters(), module.named_buffers()):
            if any(p.fullmatch(name) for p in self.param_filter):
                self.compress_tensors[tensor] = name
                self.annotate(tensor)
        module.register_forward_pre_hook(self._forward_pre_hook)

    def _forward_pre_hook(self, module, inputs):
        for tensor in list(self.compress_tensors.keys()):
            self.annotate(tensor)

    def annotate(self, tensor: torch.Tensor) -> None:
        """Annotates ``tensor`` with this compression format."""
        _annotations[tensor] = self.format

    def __repr__(self):
        patterns = [p.pattern for p in self.param_filter]
        return f"Compression(format={self.format}, param_filter: {patterns})"
