"""What every workload provides to the step engine: tokenized prompts, gold answers, a reward.

A `Task` is built once per host at start-up (`locoexp.dataset.build.build_task`). Prompts are
rendered and tokenized then, so admission on the step path only indexes arrays. Rewards are
verifiable: a completion is compared with the gold answer, and model output is never run as code.
"""

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Tokenizer(Protocol):
    vocab_size: int  # ids are in [0, vocab_size)
    eos_id: int  # generation stops here (the engine's stop token)
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclasses.dataclass(frozen=True)
class Example:
    """One prompt. `id` is stable within its split: two runs can check they saw the same prompts."""

    id: int
    prompt_tokens: np.ndarray  # [P] int32, already rendered (chat template) and capped
    answer: str  # what the reward checks a completion against


class Task(Protocol):
    tokenizer: Tokenizer
    train: Sequence[Example]
    eval: Sequence[Example]
    # Prompts longer than the cap that were dropped or truncated at load time (for metrics).
    long_prompts: int

    def score(self, examples: Sequence[Example], completions: Sequence[np.ndarray]) -> np.ndarray:
        """Rewards [N] float32 in [0, 1] for completions [N] (token ids, ending with EOS when one
        was emitted; cut at the response cap otherwise)."""
        ...

    def is_correct(self, rewards: np.ndarray) -> np.ndarray:
        """Which rewards count as a solved prompt for held-out accuracy."""
        ...
