"""Benchmarking helpers."""

from cstorch.utils.benchmark.dataloader import benchmark_dataloader

__all__ = ["benchmark_dataloader"]
