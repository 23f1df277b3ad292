"""Device and execution-strategy names of the 1.8/1.9 command line."""


class DeviceType:
    """Target devices of ``python run.py {CPU,GPU,CSX} ...``."""

    CSX = "CSX"
    CPU = "CPU"
    GPU = "GPU"
    ANY = "ANY"  # extra arguments that apply to every device

    @classmethod
    def devices(cls):
        return [cls.CSX, cls.CPU, cls.GPU]


class ExecutionStrategy:
    """Cerebras execution strategies (``python run.py CSX {pipeline,weight_streaming}``)."""

    pipeline = "pipeline"
    weight_streaming = "weight_streaming"

    @classmethod
    def strategies(cls):
        return [cls.pipeline, cls.weight_streaming]
