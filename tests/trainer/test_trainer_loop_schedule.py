"""How a fit is split into training loops, and which steps of each loop checkpoint."""

import pytest

from cerebras.modelzoo.trainer.callbacks import TrainingLoop
from cerebras.modelzoo.trainer.callbacks.loop import _split


@pytest.mark.parametrize(
    "total, eval_frequency, loops",
    [
        (24, 12, [12, 12]),
        (10, 4, [4, 4, 2]),
        (10, None, [10]),
        (10, 0, [10]),
        (10, 1.0, [10]),
        (10, 0.5, [5, 5]),
        (10, 0.3, [3, 3, 3, 1]),
        (3, 0.1, [1, 1, 1]),
        (5, 7, [5]),
    ],
)
def test_training_loops_of_a_fit(total, eval_frequency, loops):
    assert _split(total, eval_frequency) == loops


@pytest.mark.parametrize(
    "total, eval_frequency, every",
    [(24, 12, 12), (10, 4, 3), (10, None, 3), (7, 2, 5), (9, 3, 1), (6, 4, 10), (12, 5, 4)],
)
def test_checkpoints_fall_on_multiples_of_steps_and_the_last_step(total, eval_frequency, every):
    loop = TrainingLoop(num_steps=total, eval_frequency=eval_frequency)
    loop.train_steps = _split(total, eval_frequency)
    saved, offset = [], 0
    for index, length in enumerate(loop.train_steps):
        schedule = loop.checkpoint_steps(every, index)
        saved += [offset + step + 1 for step in (schedule.range() if schedule else [])]
        offset += length
    assert saved == sorted(set(range(every, total + 1, every)) | {total})
    assert loop.checkpoint_steps(None, 0) is None and loop.checkpoint_steps(0, 0) is None
