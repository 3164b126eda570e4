"""What every workload provides to the step engine: tokenized prompts, gold answers, a reward.

A `Task` is built once per host at start-up (`locoexp.dataset.build.build_task`). Prompts are
rendered and tokenized then, to apply the prompt cap and to know prompt lengths (O3). Admission
on the step path renders and tokenizes every request again with `Task.encode_prompt`, as the
paper's admitting process does (Section 4.3), unless `opt.pretokenize_prompts` reuses the load-time
tokens (locoexp/placement/admission.py). Rewards are verifiable: a completion is compared with the
gold answer, and model output is never run as code.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from locoexp.tokenizer.protocol import Tokenizer


@dataclasses.dataclass(frozen=True)
class Example:
    """One prompt. `id` is stable within its split: two runs can check they saw the same prompts."""

    id: int
    prompt_tokens: np.ndarray  # [P] int32, already rendered (chat template) and capped
    answer: str  # what the reward checks a completion against
    # The conversation the prompt renders (chat turns); empty for tasks without text prompts.
    messages: tuple[Mapping[str, str], ...] = ()


class Task(Protocol):
    # Read-only members (properties): a task may hold a narrower tokenizer or a list of examples.
    @property
    def tokenizer(self) -> Tokenizer: ...
    @property
    def train(self) -> Sequence[Example]: ...
    @property
    def eval(self) -> Sequence[Example]: ...
    @property
    def long_prompts(self) -> int:
        """Prompts longer than the cap that were dropped or truncated at load time (metrics)."""
        ...

    def encode_prompt(self, example: Example) -> np.ndarray:
        """Engine input for one request of `example`, made from its text now (chat template,
        tokenization, prompt cap): [P] int32, equal to `example.prompt_tokens`."""
        ...

    def score(self, examples: Sequence[Example], completions: Sequence[np.ndarray]) -> np.ndarray:
        """Rewards [N] float32 in [0, 1] for completions [N] (token ids, ending with EOS when one
        was emitted; cut at the response cap otherwise)."""
        ...

    def is_correct(self, rewards: np.ndarray) -> np.ndarray:
        """Which rewards count as a solved prompt for held-out accuracy."""
        ...
