"""Cluster configuration and single-host stand-ins for the appliance's rank helpers."""

from cstorch.distributed.cluster_config import ClusterConfig

__all__ = ["ClusterConfig"]
