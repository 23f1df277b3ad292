"""``full_pb2``: the stack's full configuration (the 1.x appliance runner passes
``cbtorch.state().full_config`` through; this engine reads nothing from it)."""

from cerebras_appliance.pb.messages import Message


class MatchingConfig(Message):
    FIELDS = {"autogen_policy": 0}


class FullConfig(Message):
    FIELDS = {"matching": MatchingConfig, "ini_content": ""}
