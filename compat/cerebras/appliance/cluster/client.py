"""``TelemetryClient``: where a real run would send telemetry to the cluster's management
server. With no cluster it buffers nothing and sends nothing; it logs at debug level what it
was given so a run's telemetry calls stay visible."""

from __future__ import annotations

import logging

_log = logging.getLogger("cerebras.appliance.cluster.client")


class TelemetryClient:
    def __init__(self, client=None, max_buffer_size: int = 1000, max_buffer_seconds: int = 60):
        self.client = client
        self.max_buffer_size = max_buffer_size
        self.max_buffer_seconds = max_buffer_seconds

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.flush()
        return False

    def push(self, metrics: dict, labels: dict | None = None) -> None:
        _log.debug("telemetry (not sent, no cluster): %s %s", metrics, labels or {})

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
