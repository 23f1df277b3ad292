"""``autogen_pb2``: the autogen policy enum (``AP_DISABLED`` is what the 1.x zoo imports)."""

from cerebras_appliance.pb.messages import Enum


class AutogenPolicy(Enum):
    VALUES = {"AP_DISABLED": 0, "AP_MEDIUM": 1, "AP_AGGRESSIVE": 2, "AP_MAX": 3}


AP_DISABLED = 0
AP_MEDIUM = 1
AP_AGGRESSIVE = 2
AP_MAX = 3
