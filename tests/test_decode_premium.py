"""Figure 7b's per-iteration decode time as a run records it: `rollout/decode_ms_per_iteration`
counts the engine's decode iterations only, not prefill or compiles. A long prompt with few new
tokens makes the difference large: the generation phase is then mostly prefill."""

import jax
import numpy as np
from tiny_policy import PAD, TINY, tiny_model

from locoexp.algo.config import AdvantageKind
from locoexp.dataset.schedule import PromptSchedule
from locoexp.dataset.task import Example
from locoexp.metrics.timing import StepTimer
from locoexp.placement.config import OptConfig
from locoexp.placement.halves import Published, RolloutHalf
from locoexp.placement.settings import StepSettings
from locoexp.rollout.config import RolloutConfig, SamplingParams
from locoexp.rollout.engine import JaxEngine

PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 4, 1024, 3


class LongPromptTask:
    """Prompts of random ids (no text behind them: admission copies them); rewards 0."""

    def __init__(self):
        rng = np.random.default_rng(0)
        ids = rng.integers(1, TINY.vocab_size, (PROMPTS, PROMPT_TOKENS), np.int32)
        self.train = [Example(id=i, prompt_tokens=ids[i], answer="") for i in range(PROMPTS)]
        self.eval, self.long_prompts = [], 0

    def encode_prompt(self, example):
        return example.prompt_tokens.copy()

    def score(self, examples, completions):
        return np.zeros(len(examples), np.float32)

    def is_correct(self, rewards):
        return rewards > 0


def test_decode_ms_per_iteration_excludes_prefill():
    engine = JaxEngine(
        tiny_model(seed=0),
        RolloutConfig(prompt_bucket_tokens=1),
        eos_id=-1,
        pad_id=PAD,
        devices=jax.local_devices(),
    )
    sampling = SamplingParams(temperature=1.0, ignore_eos=True)
    settings = StepSettings(
        group_size=2,
        max_new_tokens=NEW_TOKENS,
        row_tokens=PROMPT_TOKENS + NEW_TOKENS,
        loss_slot_multiple=1,
        sampling=sampling,
        eval_sampling=sampling,
        advantage=AdvantageKind.grpo,
        advantage_eps=1e-6,
        opt=OptConfig(),
    )
    timer = StepTimer()
    half = RolloutHalf(
        task=LongPromptTask(),
        schedule=PromptSchedule(PROMPTS, PROMPTS, seed=0, batches_per_pass=None, passes=1),
        engine=engine,
        settings=settings,
        host=0,
        hosts=1,
        timer=timer,
    )
    shares = []
    for step in range(4):  # step 0 compiles
        with timer.step():
            metrics = half.run(step, Published(0)).report.metrics
        iterations = metrics["rollout/decode_iterations"]
        decode_ms = metrics["rollout/decode_ms_per_iteration"] * iterations
        shares.append(decode_ms / (1e3 * timer.metrics()["timing/generation_s"]))
    assert iterations == NEW_TOKENS - 1  # the first new token comes from prefill
    # Generation is a 1,024-token prefill plus two one-token decode iterations: the decode
    # iterations are a small part of it. Counting prefill would put the whole phase in. The
    # least share of three steps: a step the loaded machine paused in decode is not the figure.
    assert 0 < min(shares[1:]) < 0.5, shares
