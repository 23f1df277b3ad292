"""1.6/1.7 ``cs_perf_analyzer``: reads the performance log a CS system's job wrote to find
the run's bottleneck. The modeled wafer writes no such log, so ``locate_csperf_log`` finds
none and the zoo reports "Not Applicable" (its own branch for a missing log)."""

from __future__ import annotations


def locate_csperf_log(model_dir: str):
    """The job's performance log under ``model_dir``: none is written here."""
    return None


class AssessBottlenecks:
    def __init__(self, perf_file):
        raise FileNotFoundError(
            f"No CS performance log to assess ({perf_file!r}): the modeled wafer writes none."
        )
