"""``cerebras_appliance.appliance_manager`` (1.7 to 1.9): the types the zoo's sparsity code
uses to group the weights sent to the appliance. The modeled wafer takes its weights from
the process directly, so these are plain records; nothing sends them anywhere."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, List, Optional


@dataclasses.dataclass
class TensorSendPayload:
    rt_name: str = ""
    fw_name: str = ""
    tensor: Any = None


@dataclasses.dataclass
class TensorGroup:
    tensors: List[TensorSendPayload]
    closure: Optional[Callable] = None


# A grouper maps the payloads to send to the groups they are sent in.
TensorGrouper = Callable[[Iterable[TensorSendPayload]], Iterable[TensorGroup]]
