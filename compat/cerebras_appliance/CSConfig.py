"""``cerebras_appliance.CSConfig``: the 1.7 to 1.9 cluster configuration object.

Its settings are what the 1.x Model Zoo passes (``num_csx``, ``max_wgt_servers``,
``debug_args``, ...). This engine runs the modeled wafer in this process, so the cluster
settings are recorded, validated for type and otherwise unused; ``num_csx`` is 1 (the zoo
divides the loss by it) and anything else is refused with the reason.
"""

from __future__ import annotations

from cerebras_appliance.pb.workflow.appliance.common.common_config_pb2 import DebugArgs

DEFAULT_COMPILE_DIR = "cached_compile"


class CSConfig:
    def __init__(
        self,
        num_csx=1,
        max_wgt_servers=None,
        mgmt_address=None,
        mgmt_namespace=None,
        credentials_path=None,
        debug_args=None,
        mount_dirs=None,
        python_paths=None,
        transfer_processes=None,
        num_workers_per_csx=0,
        execution_strategy=None,
        job_labels=None,
        max_act_per_csx=None,
        job_time_sec=None,
        disable_version_check=False,
        precision_opt_level=1,
        **unused,
    ):
        num_csx = 1 if num_csx is None else num_csx
        if num_csx != 1:
            raise ValueError(
                f"num_csx={num_csx}: this engine models one CS system; set "
                "num_csx to 1 (data-parallel runs over several systems are not "
                "modeled)."
            )
        if debug_args is not None and not isinstance(debug_args, (DebugArgs, dict)):
            # the 1.x message, or the dict-based DebugArgs get_debug_args reads from a file
            raise TypeError(f"debug_args must be a DebugArgs, got {type(debug_args).__name__}.")
        self.num_csx = num_csx
        self.max_wgt_servers = max_wgt_servers
        self.mgmt_address = mgmt_address
        self.mgmt_namespace = mgmt_namespace
        self.credentials_path = credentials_path
        self.debug_args = debug_args if debug_args is not None else DebugArgs()
        self.mount_dirs = list(mount_dirs or [])
        self.python_paths = list(python_paths or [])
        self.transfer_processes = transfer_processes
        self.num_workers_per_csx = num_workers_per_csx
        self.execution_strategy = execution_strategy
        self.job_labels = list(job_labels or [])
        self.max_act_per_csx = max_act_per_csx
        self.job_time_sec = job_time_sec
        self.disable_version_check = disable_version_check
        self.precision_opt_level = precision_opt_level
        self.unused = dict(unused)

    def __repr__(self):
        return f"CSConfig(num_csx={self.num_csx}, precision_opt_level={self.precision_opt_level})"
