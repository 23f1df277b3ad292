"""A torch function captured and lowered by the engine alone (no cstorch step), for the tests
that check an op's lowering: its numbers, and the program it gives on a target."""

import jax

from jax_backend import GraphInterpreter, capture_step, dtypes
from jax_backend.target import Target, lowering_for


def lowered(fn, inputs, target=Target()):
    """(the jitted program of ``fn`` captured on the torch tensors ``inputs`` and lowered for
    ``target``, its arguments): call it on them for the outputs (a list of arrays), or
    ``.lower(args).as_text()`` for its StableHLO."""
    interpreter = GraphInterpreter(capture_step(fn, [], list(inputs)).graph)

    def program(args):
        with lowering_for(target):
            return interpreter.run(args)

    return jax.jit(program), [dtypes.tensor_to_array(x) for x in inputs]
