"""``cerebras_pytorch.workflow`` (1.6/1.7): the performance analyzer the zoo's perf utilities
import (``python.cs_perf_analyzer``)."""
