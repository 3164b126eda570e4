"""Continuous batching (`rollout.scheduler=continuous`) against static waves of the same engine.

Each request draws its tokens from its own PRNG stream, so the two schedulers must give every
request the same completion, greedy or sampled, although its slot, its neighbours and the width
it is decoded at all differ. 12 requests of 2-11 tokens (bucket 16, prefilled in chunks of 4)
share 4 slots; the EOS id is one that greedy decoding reaches in some rows only, so rows end at
different iterations and slots are refilled mid-loop.
"""

import jax
import numpy as np
import pytest
from tiny_policy import PAD, random_prompts, tiny_model

from locoexp.compose import compose_config
from locoexp.errors import ConfigError
from locoexp.rollout.config import RolloutConfig, SamplingParams, Scheduler
from locoexp.rollout.engine import JaxEngine

MAX_NEW = 12
LENGTHS = (3, 5, 9, 4, 7, 2, 6, 8, 5, 3, 11, 2)
GREEDY = SamplingParams(temperature=0.0)


def make_engine(model, scheduler: Scheduler, *, eos_id: int, capacity: int = 4) -> JaxEngine:
    config = RolloutConfig(
        prompt_bucket_tokens=1, prefill_chunk_tokens=4, capacity=capacity, scheduler=scheduler
    )
    return JaxEngine(model, config, eos_id=eos_id, pad_id=PAD, devices=jax.local_devices())


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(LENGTHS, seed=4)


@pytest.fixture(scope="module")
def engines(model, prompts):
    """Both schedulers with an EOS that greedy decoding reaches in some rows, not all."""
    free = make_engine(model, Scheduler.waves, eos_id=-1).generate(
        prompts, key=jax.random.key(0), max_new_tokens=MAX_NEW, sampling=GREEDY
    )
    hits = lambda t: (free.tokens[:, 1:-1] == t).any(axis=1).sum()
    eos = next(t for t in range(2, 64) if 3 <= hits(t) <= len(prompts) - 3)
    return {s: make_engine(model, s, eos_id=eos) for s in Scheduler}


def both(engines, prompts, sampling, **kwargs):
    return [
        engines[s].generate(
            prompts, key=jax.random.key(5), max_new_tokens=MAX_NEW, sampling=sampling, **kwargs
        )
        for s in (Scheduler.waves, Scheduler.continuous)
    ]


def assert_same_completions(waves, continuous):
    np.testing.assert_array_equal(continuous.tokens, waves.tokens)
    np.testing.assert_array_equal(continuous.lengths, waves.lengths)
    np.testing.assert_array_equal(continuous.truncated, waves.truncated)
    np.testing.assert_allclose(continuous.logprobs, waves.logprobs, atol=1e-5, rtol=0)


def test_greedy_completions_are_identical_request_by_request(engines, prompts):
    waves, continuous = both(engines, prompts, GREEDY)
    assert waves.truncated.any() and not waves.truncated.all(), "rows must end at EOS and cap"
    assert_same_completions(waves, continuous)
    assert (waves.waves, waves.refills) == (3, 0)
    assert (continuous.waves, continuous.refills) == (1, len(prompts) - 4)
    assert continuous.decode_iterations < waves.decode_iterations


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=5, top_p=0.9)],
    ids=["full", "top-k-top-p"],
)
def test_sampled_completions_are_identical_request_by_request(engines, prompts, sampling):
    """Same keys per request: the same draws, so the same distribution, sample by sample."""
    assert_same_completions(*both(engines, prompts, sampling))


def test_forced_lengths_refill_every_slot_and_keep_it_busy(engines, prompts):
    caps = [1, 12, 3, 7, 2, 12, 5, 9, 4, 6, 12, 1]
    forced = SamplingParams(temperature=1.0, ignore_eos=True)
    waves, continuous = both(engines, prompts, forced, request_caps=caps)
    assert_same_completions(waves, continuous)
    np.testing.assert_array_equal(continuous.lengths, caps)
    assert continuous.truncated.all()
    # waves: 4 rows per iteration until each wave's longest row ends (11 + 11 + 11)
    assert waves.decode_iterations == 33
    assert waves.slot_occupancy == pytest.approx((sum(caps) - len(caps)) / (33 * 4))
    iterations, live = refill_by_hand(caps, slots=4)
    assert (continuous.decode_iterations, continuous.refills) == (iterations, len(caps) - 4)
    assert continuous.slot_occupancy == pytest.approx(live / (iterations * 4))
    assert iterations < 33


def refill_by_hand(caps: list[int], *, slots: int) -> tuple[int, int]:
    """Decode iterations and live slot-iterations of slot refill, simulated: the first `slots`
    requests' first tokens come with their prefill, then one token per iteration; a slot whose
    request has all its tokens takes the next request at once, whose first token comes with
    the next iteration's (4 slots: no compaction below them)."""
    waiting, remaining = list(caps), []
    iterations = live = 0

    def fill():
        while waiting and len(remaining) < slots:
            remaining.append(waiting.pop(0))

    fill()
    remaining[:] = [r - 1 for r in remaining if r > 1]
    fill()
    while remaining:
        iterations, live = iterations + 1, live + len(remaining)
        remaining[:] = [r - 1 for r in remaining if r > 1]
        fill()
    return iterations, live


def test_finished_rows_are_compacted_out_of_the_decode(model, prompts):
    """8 slots, one request of 12 tokens and seven of one: once nothing waits and at most 4
    rows are live, decoding goes on 4 wide, never 8 (waves computes all 8 to the end)."""
    caps = [12] + [1] * 7
    forced = SamplingParams(temperature=1.0, ignore_eos=True)
    runs = {
        s: make_engine(model, s, eos_id=-1, capacity=8).generate(
            prompts[:8], key=jax.random.key(1), max_new_tokens=MAX_NEW, sampling=forced,
            request_caps=caps,
        )
        for s in Scheduler
    }  # fmt: skip
    assert_same_completions(runs[Scheduler.waves], runs[Scheduler.continuous])
    assert runs[Scheduler.waves].slot_occupancy == pytest.approx(11 / (11 * 8))
    assert runs[Scheduler.continuous].slot_occupancy == pytest.approx(11 / (11 * 4))


def test_a_width_reached_from_two_wider_ones_compacts_from_each(model):
    """16 slots (widths 16, 8, 4): the first call compacts 16 -> 8 -> 4, the second 16 -> 4
    straight; the second must not reuse the 8 -> 4 program on 16 rows."""
    forced = SamplingParams(temperature=1.0, ignore_eos=True)
    engine = make_engine(model, Scheduler.continuous, eos_id=-1, capacity=16)
    prompts = random_prompts([3] * 16, seed=2)
    for caps in ([12] + [8] * 4 + [1] * 11, [12] + [1] * 15):
        out = engine.generate(
            prompts, key=jax.random.key(3), max_new_tokens=MAX_NEW, sampling=forced,
            request_caps=caps,
        )  # fmt: skip
        np.testing.assert_array_equal(out.lengths, caps)


def test_an_unknown_scheduler_is_refused_naming_the_key_and_the_choices():
    # composition names the key and the choices in one sentence (what run.py prints)
    expected = r"rollout.scheduler: Invalid value 'fifo', expected one of \[waves, continuous\]"
    with pytest.raises(ConfigError, match=expected):
        compose_config(["rollout.scheduler=fifo"])


def test_static_waves_are_refused_under_vllm():
    with pytest.raises(ConfigError, match=r"rollout.scheduler=waves is not read .* rollout=jax"):
        compose_config(["rollout=vllm", "rollout.scheduler=waves"])
