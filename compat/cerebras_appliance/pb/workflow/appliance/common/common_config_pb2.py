"""``common_config_pb2``: the appliance client's configuration messages (1.6 to 1.9).

``ExecutionStrategy`` (``ES_WEIGHT_STREAMING``, ``ES_PIPELINE``) and ``DebugArgs`` (its
``debug_ini.frozen_content``, the text of the debug ini) are what the 1.x Model Zoo builds;
the engine reads only the ini text (``cerebras_appliance.run_utils``'s 1.x helpers record
in it). ``cerebras_appliance.run_utils.get_debug_args`` reads files into the dict-based
``DebugArgs`` of later releases; both are accepted wherever the 1.x zoo passes one.
"""

from cerebras_appliance.pb.messages import Enum, Message


class ExecutionStrategy(Enum):
    VALUES = {"ES_UNSPECIFIED": 0, "ES_PIPELINE": 1, "ES_WEIGHT_STREAMING": 2}


ExecutionStrategy.ES_UNSPECIFIED = 0
ExecutionStrategy.ES_PIPELINE = 1
ExecutionStrategy.ES_WEIGHT_STREAMING = 2
ES_UNSPECIFIED, ES_PIPELINE, ES_WEIGHT_STREAMING = 0, 1, 2


class DebugIni(Message):
    FIELDS = {"frozen_content": ""}


class DebugArgs(Message):
    FIELDS = {
        "debug_ini": DebugIni,
        "debug_mgr": "",
        "debug_crd": "",
        "debug_usr": "",
        "debug_wrk": "",
        "debug_act": "",
        "debug_cmd": "",
        "debug_wgt": "",
    }


class ClusterDetails(Message):
    FIELDS = {"num_csx": 1}
