"""``cerebras_appliance.pb``: the protobuf configuration types of releases 1.6 to 1.9, as plain
Python objects.

The 1.x Model Zoo imports a few message and enum types from here and only builds, reads and
assigns their fields (``DebugArgs().debug_ini.frozen_content += ...``,
``ExecutionStrategy.ES_WEIGHT_STREAMING``, ``AP_DISABLED``); nothing is serialized to a
cluster, so no protobuf runtime is needed. ``messages.Message`` is the one building block.
"""
