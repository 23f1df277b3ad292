"""The exception types of ``cerebras.appliance`` that user code and the Model Zoo catch."""


class ApplianceClientException(Exception):
    """Base of every appliance error."""


class ApplianceUnknownError(ApplianceClientException): ...


class ApplianceCorruptionError(ApplianceClientException): ...


class ApplianceDeadlockError(ApplianceClientException): ...


class ApplianceForceCollectDebug(ApplianceClientException): ...


class ApplianceHealthPollException(ApplianceCorruptionError): ...


class ApplianceNanError(ApplianceClientException):
    """A NaN or infinity was found in the run's values (e.g. the loss)."""


class ApplianceTensorDropped(ApplianceClientException): ...


class ApplianceDropModeComplete(ApplianceClientException): ...


class ApplianceRequestCancelled(ApplianceClientException): ...


class ApplianceCompilationError(ApplianceClientException): ...


class ApplianceRuntimeServerError(ApplianceClientException): ...


class ApplianceServiceInterrupted(ApplianceClientException): ...


class ApplianceRuntimeJobTimeoutError(ApplianceClientException): ...


class ApplianceVersionError(ApplianceClientException): ...


class ApplianceCsctlError(ApplianceClientException): ...


class ApplianceUserVenvClusterVolumeError(ApplianceClientException): ...


class ApplianceResourceExhausted(ApplianceClientException): ...


class ClusterJobCancelledByCsctl(ApplianceClientException): ...


class ClusterJobScheduleError(ApplianceClientException): ...


class ClusterJobInitError(ApplianceClientException): ...
