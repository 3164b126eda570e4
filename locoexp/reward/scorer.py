"""`RewardScorer`: score (gold, response) text pairs in the host process or in a process pool.

The pool is the paper's family C ("optional process-pool reward evaluation", Table B1): with
`workers > 0` the pairs are split into one chunk per worker and scored by `spawn`ed processes
(not forked: the host process runs JAX threads). The pool starts on first use and lives as long
as the scorer. Rewards are identical either way.
"""

import concurrent.futures
import enum
import multiprocessing
from collections.abc import Sequence

import numpy as np


class RewardKind(enum.Enum):
    math = "math"
    swe_action = "swe_action"


def score_pairs(kind: RewardKind, golds: Sequence[str], responses: Sequence[str]) -> list[float]:
    """Rewards in [0, 1] for each (gold, response) pair (module level: picklable for the pool)."""
    from locoexp.reward.math import math_reward
    from locoexp.reward.swe import swe_action_reward

    reward = {RewardKind.math: math_reward, RewardKind.swe_action: swe_action_reward}[kind]
    return [reward(g, r) for g, r in zip(golds, responses, strict=True)]


class RewardScorer:
    def __init__(self, kind: RewardKind, *, workers: int):
        self.kind = kind
        self.workers = workers
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def __call__(self, golds: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        """Rewards [N] float32."""
        if self.workers == 0 or len(golds) < 2:
            return np.asarray(score_pairs(self.kind, golds, responses), np.float32)
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._pool = concurrent.futures.ProcessPoolExecutor(self.workers, mp_context=context)
        bounds = np.linspace(0, len(golds), min(self.workers, len(golds)) + 1).astype(int)
        futures = [
            self._pool.submit(score_pairs, self.kind, golds[a:b], responses[a:b])
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        return np.asarray([r for f in futures for r in f.result()], np.float32)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
