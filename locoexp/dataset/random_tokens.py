"""Workload W1's task (tools/bench_w1.py, issue 2): prompts of random token ids, reward = the
share of even ids in a completion.

It measures the work of a step, not learning: every prompt is `max_prompt_tokens` ids drawn
uniformly from [2, V) (ids 0 and 1 are pad and eos), with no text behind them, and the reward is
a deterministic function that differs between the samples of a group, so group advantages are
non-zero and the trainer does its full work. Training and held-out prompts are drawn apart.
"""

from collections.abc import Sequence

import numpy as np

from locoexp.dataset.config import RandomTokensConfig
from locoexp.dataset.task import Example
from locoexp.tokenizer.ids import IdTokenizer


class RandomTokensTask:
    def __init__(
        self, config: RandomTokensConfig, *, vocab_size: int, prompt_tokens: int, seed: int
    ):
        self.tokenizer = IdTokenizer(vocab_size)
        rng = np.random.default_rng(seed)
        count = config.train_size + config.held_out_size
        ids = rng.integers(2, vocab_size, (count, prompt_tokens), np.int32)
        examples = [Example(id=i, prompt_tokens=ids[i], answer="") for i in range(count)]
        self.train = examples[: config.train_size]
        self.eval = [
            Example(id=i, prompt_tokens=e.prompt_tokens, answer="")
            for i, e in enumerate(examples[config.train_size :])
        ]
        self.long_prompts = 0

    def encode_prompt(self, example: Example) -> np.ndarray:
        """The ids have no text behind them: admission copies them per request."""
        return example.prompt_tokens.copy()

    def score(self, examples: Sequence[Example], completions: Sequence[np.ndarray]) -> np.ndarray:
        return np.array([np.mean(c % 2 == 0) if len(c) else 0.0 for c in completions], np.float32)

    def is_correct(self, rewards: np.ndarray) -> np.ndarray:
        return rewards >= 0.5
