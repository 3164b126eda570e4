"""The paper's protocol as one switch: the same batches twice, in the same seeded order."""

import numpy as np

from locoexp.dataset.schedule import PromptSchedule


def _ids(schedule: PromptSchedule, steps: int) -> list[list[int]]:
    return [schedule.batch(step).tolist() for step in range(steps)]


def test_same_seed_and_two_passes_give_identical_prompts_per_step():
    a = PromptSchedule(7473, 128, seed=3, batches_per_pass=20, passes=2)
    b = PromptSchedule(7473, 128, seed=3, batches_per_pass=20, passes=2)
    assert a.total_steps == b.total_steps == 40
    assert _ids(a, 40) == _ids(b, 40)


def test_second_pass_replays_the_first_and_is_the_scored_one():
    schedule = PromptSchedule(7473, 128, seed=3, batches_per_pass=20, passes=2)
    ids = _ids(schedule, 40)
    assert ids[20:] == ids[:20]
    first_pass = np.concatenate(ids[:20])
    assert len(np.unique(first_pass)) == 20 * 128  # distinct prompts within a pass
    assert [schedule.is_scored(t) for t in (0, 19, 20, 39)] == [False, False, True, True]


def test_another_seed_gives_another_order():
    a = PromptSchedule(7473, 128, seed=3, batches_per_pass=20, passes=2)
    b = PromptSchedule(7473, 128, seed=4, batches_per_pass=20, passes=2)
    assert _ids(a, 1) != _ids(b, 1)
