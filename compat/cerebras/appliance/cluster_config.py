"""``ClusterConfig`` lives in ``cerebras.pytorch.distributed``; the appliance path names it too."""

from cstorch.distributed.cluster_config import ClusterConfig, MountDir, NotificationTarget  # noqa: F401
