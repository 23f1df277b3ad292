"""The module ``__getattr__`` of ``cstorch``: names removed from the API say where they went."""

_SUMMARY_HELP = (
    "cstorch.{name} is now removed. Create a SummaryWriter and write to it directly:\n\n"
    "\timport cerebras.pytorch.utils.tensorboard\n\n"
    "\twriter = cerebras.pytorch.utils.tensorboard.SummaryWriter(log_dir='./log_dir')\n"
    "\twriter.add_{kind}(...)\n\n"
    "Write to a SummaryWriter only inside a step closure."
)


def __getattr__(name):
    if name in ("summarize_scalar", "summarize_tensor"):
        raise AttributeError(_SUMMARY_HELP.format(name=name, kind=name.split("_")[1]))
    raise AttributeError(f"module 'cstorch' has no attribute {name!r}")
