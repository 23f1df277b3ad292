"""``full_pb2``: the stack's full configuration. The 1.x zoo's transformers set compiler
hints on ``cbtorch.state().full_config`` when they build for a CS system (gpt2, t5 and
transformer: ``matching.kernel.inc_pwt_estimate`` / ``enable_pipelined_mlm_loss``,
``matching.autogen_policy``; bert: ``matching.kernel.no_dcache_spill_splits``); the
appliance runner passes it through. This engine compiles with XLA and reads none of them."""

from cerebras_appliance.pb.messages import Message


class KernelMatchingConfig(Message):
    FIELDS = {
        "inc_pwt_estimate": False,
        "enable_pipelined_mlm_loss": False,
        "no_dcache_spill_splits": False,
    }


class MatchingConfig(Message):
    FIELDS = {"autogen_policy": 0, "kernel": KernelMatchingConfig}


class FullConfig(Message):
    FIELDS = {"matching": MatchingConfig, "ini_content": ""}
