"""How many times XLA compiled a traced step: one per distinct jit signature of its programs.

``TracedStep.trace_count`` only counts Python traces. A program can still be compiled again
by ``jax.jit`` when a later call passes arrays that differ in something jit keys on (dtype,
weak type, sharding, donation); this counts those compilations from the jit caches."""


def xla_compilations(traced_step) -> int:
    return sum(program._jitted._cache_size() for program in traced_step.programs)
