"""Which prompts each step admits: a seeded, stable order, optionally the paper's two passes.

Section 3.1 / Appendix A: "each run covers the same 20 batches twice (40 steps) and scores the
second pass", so two placements see the same prompts in the same order. Here that is
`batches_per_pass=20, passes=2`. Without `batches_per_pass` a pass walks the whole training split
in a seeded permutation, and each later pass re-shuffles (epochs).
"""

import numpy as np

from locoexp.dataset.config import DatasetConfig
from locoexp.errors import ConfigError, require


class PromptSchedule:
    """Step t -> indices [B] into the training split. Pure function of (seed, t): restartable."""

    def __init__(
        self,
        num_examples: int,
        prompts_per_step: int,
        *,
        seed: int,
        batches_per_pass: int | None,
        passes: int,
    ):
        self.num_examples = num_examples
        self.prompts_per_step = prompts_per_step
        self.seed = seed
        self.passes = passes
        self.batches_per_pass = batches_per_pass or num_examples // prompts_per_step
        self.fixed_batches = batches_per_pass is not None
        if self.batches_per_pass < 1 or self.batches_per_pass * prompts_per_step > num_examples:
            raise ValueError(
                f"{self.batches_per_pass} batches of {prompts_per_step} prompts need "
                f"{max(1, self.batches_per_pass) * prompts_per_step} training prompts; "
                f"the split has {num_examples}"
            )

    @property
    def total_steps(self) -> int | None:
        """Steps the schedule defines when batches repeat (None: any number of epochs)."""
        return self.batches_per_pass * self.passes if self.fixed_batches else None

    def batch(self, step: int) -> np.ndarray:
        pass_index, position = divmod(step, self.batches_per_pass)
        # fixed batches: every pass replays the permutation of pass 0; epochs: a new one each
        order_seed = 0 if self.fixed_batches else pass_index
        order = np.random.default_rng([self.seed, order_seed]).permutation(self.num_examples)
        start = position * self.prompts_per_step
        return order[start : start + self.prompts_per_step]

    def is_scored(self, step: int) -> bool:
        """The last pass is the scored one (Appendix A: steady steps of the second pass)."""
        return step >= self.batches_per_pass * (self.passes - 1)


def build_schedule(dataset: DatasetConfig, *, steps: int, num_examples: int) -> PromptSchedule:
    """The run's prompt schedule over `num_examples` training rows; refuses one that cannot give
    `steps` batches (`dataset.batches_per_pass` x `dataset.passes`)."""
    d = dataset
    try:
        schedule = PromptSchedule(
            num_examples,
            d.prompts_per_step,
            seed=d.seed,
            batches_per_pass=d.batches_per_pass,
            passes=d.passes,
        )
    except ValueError as error:
        raise ConfigError(
            f"dataset.batches_per_pass / dataset.prompts_per_step: {error}."
        ) from None
    total = schedule.total_steps
    require(
        total is None or steps <= total,
        f"steps={steps} exceeds the {total} steps that dataset.batches_per_pass="
        f"{d.batches_per_pass} x dataset.passes={d.passes} define; set steps<={total}.",
    )
    return schedule
