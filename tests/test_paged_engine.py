"""The JAX engine with a paged KV cache (`rollout.kv_cache=paged`) against its dense cache.

Every request draws its tokens from its own PRNG stream, so the paged engine must give each
request the dense engine's completion, greedy or sampled, whatever waits or is preempted on
the way: 12 requests of 2-11 prompt tokens and uneven caps through 4 slots (refilled on
device), pages of 4 tokens. A pool of the dense cache's size never runs dry; a pool of one row
at its caps does, so rows wait for pages and are preempted and recomputed (vLLM's rule). A
pool that cannot hold one row at its caps is refused in one sentence, at start-up and by the
engine. Over 1,004 requests of random lengths (1,000 refills) no page is lost, and a lost page
is reported by the engine. Sliding-window (Gemma4) and mixture-of-experts models decode over
pages as well; sharded layouts are in tests/test_paged_sharded_engine.py.
"""

import dataclasses

import jax
import numpy as np
import pytest
from tiny_policy import PAD, TINY, random_prompts, tiny_model

from locoexp.compose import compose_config
from locoexp.errors import ConfigError
from locoexp.model.config import Family
from locoexp.model.transformer import build_model
from locoexp.rollout import paged_slots
from locoexp.rollout.config import KVCacheKind, RolloutConfig, SamplingParams, Scheduler
from locoexp.rollout.engine import JaxEngine

MAX_NEW = 12
PAGE = 4
LENGTHS = (3, 5, 9, 4, 7, 2, 6, 8, 5, 3, 11, 2)
CAPS = (12, 3, 7, 12, 1, 9, 5, 12, 12, 2, 10, 6)
ROW_PAGES = -(-(max(p + c for p, c in zip(LENGTHS, CAPS, strict=True))) // PAGE)  # 6
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(temperature=1.0, ignore_eos=True)


def make_engine(model, *, paged: bool, pages=None, scheduler=Scheduler.continuous, eos_id=-1):
    config = RolloutConfig(
        prompt_bucket_tokens=1, prefill_chunk_tokens=4, capacity=4, scheduler=scheduler,
        kv_cache=KVCacheKind.paged if paged else KVCacheKind.dense, page_tokens=PAGE,
        kv_cache_pages_per_replica=pages,
    )  # fmt: skip
    return JaxEngine(model, config, eos_id=eos_id, pad_id=PAD, devices=jax.local_devices()[:1])


def generate(engine, prompts, sampling, caps=CAPS):
    return engine.generate(
        prompts, key=jax.random.key(5), max_new_tokens=MAX_NEW, sampling=sampling,
        request_caps=caps,
    )  # fmt: skip


def assert_same_completions(got, expected):
    np.testing.assert_array_equal(got.lengths, expected.lengths)
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(LENGTHS, seed=4)


@pytest.fixture(scope="module")
def dense(model, prompts):
    engine = make_engine(model, paged=False)
    return {
        label: generate(engine, prompts, s)
        for label, s in (("greedy", GREEDY), ("sampled", SAMPLED))
    }


@pytest.mark.parametrize("scheduler", list(Scheduler))
def test_paged_cache_gives_the_dense_caches_completions(model, prompts, dense, scheduler):
    """A pool of the dense cache's size (every slot at its caps): nothing waits, and each
    request's greedy and sampled completion is the dense cache's."""
    engine = make_engine(model, paged=True, scheduler=scheduler)
    for label, sampling in (("greedy", GREEDY), ("sampled", SAMPLED)):
        got = generate(engine, prompts, sampling)
        assert_same_completions(got, dense[label])
        if scheduler is Scheduler.continuous:
            assert got.refills == dense[label].refills == len(LENGTHS) - 4


@pytest.mark.parametrize("scheduler", list(Scheduler))
def test_a_dry_pool_waits_then_preempts_and_recomputes_with_the_same_completions(
    model, prompts, dense, scheduler
):
    """A pool of one row at its caps for 4 slots: rows wait for pages, and when every running
    row waits the last is preempted and its request recomputed from its prompt (each
    re-prefill counts as a refill), to the dense cache's completions."""
    engine = make_engine(model, paged=True, pages=ROW_PAGES, scheduler=scheduler)
    got = generate(engine, prompts, GREEDY)
    assert_same_completions(got, dense["greedy"])
    reprefills = got.refills - (len(LENGTHS) - 4 if scheduler is Scheduler.continuous else 0)
    assert reprefills > 0  # preempted (or parked at the start) and prefilled again
    assert got.slot_occupancy < dense["greedy"].slot_occupancy  # rows waited for pages


def test_no_page_is_lost_over_a_thousand_refills_of_random_lengths(model):
    """1,004 requests of random prompt lengths and caps through 4 slots, with a pool of two
    rows at their caps (rows wait and are preempted): every page is back in the pool when the
    last request ends, or the engine raises. With the release of ended rows taken out, the same
    check reports the pages lost."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 12, size=1004)
    caps = rng.integers(1, MAX_NEW + 1, size=1004)
    engine = make_engine(model, paged=True, pages=2 * ROW_PAGES)
    got = generate(engine, random_prompts(tuple(lengths), seed=1), GREEDY, caps=tuple(caps))
    assert got.refills >= 1000 and (got.lengths == caps).all()


def test_pages_not_given_back_are_reported_by_the_engine(model, prompts, monkeypatch):
    engine = make_engine(model, paged=True, pages=len(LENGTHS) * ROW_PAGES)  # never dry
    monkeypatch.setattr(paged_slots, "release_ended", lambda c, ended, replicas: c)
    with pytest.raises(RuntimeError, match=r"ended a generate call with \d+ pages still held"):
        generate(engine, prompts, GREEDY)


def test_a_pool_smaller_than_one_row_at_its_caps_is_refused_by_the_engine(model, prompts):
    engine = make_engine(model, paged=True, pages=ROW_PAGES - 1)
    with pytest.raises(ConfigError, match=r"rollout.kv_cache_pages_per_replica=5 cannot hold one"):
        generate(engine, prompts, GREEDY)


def test_a_pool_smaller_than_one_row_at_its_caps_is_refused_at_start_up():
    """dataset caps 16 + 8 tokens need 6 pages of 4."""
    paged = ["rollout.kv_cache=paged", "rollout.page_tokens=4"]
    compose_config([*paged, "rollout.kv_cache_pages_per_replica=6"])
    with pytest.raises(ConfigError) as refused:
        compose_config([*paged, "rollout.kv_cache_pages_per_replica=5"])
    message = str(refused.value)
    assert "rollout.kv_cache_pages_per_replica=5 cannot hold one row at its caps" in message
    assert "set it to at least 6" in message and message.count(". ") == 0


@pytest.mark.parametrize(
    "overrides, applies",
    [
        (["rollout.page_tokens=8"], "rollout=jax with rollout.kv_cache=paged"),
        (["rollout.kv_cache_pages_per_replica=64"], "rollout=jax with rollout.kv_cache=paged"),
        (["rollout=vllm", "rollout.kv_cache=paged"], "applies only to rollout=jax"),
    ],
)
def test_paged_keys_are_refused_where_nothing_reads_them(overrides, applies):
    with pytest.raises(ConfigError, match=applies):
        compose_config(overrides)


GEMMA4 = dataclasses.replace(
    TINY, family=Family.gemma4, num_layers=3, sliding_window=4, global_attention_every=3,
    global_head_dim=16, global_kv_heads=1, global_rotary_fraction=0.25, global_key_is_value=True,
    final_logit_softcap=30.0,
)  # fmt: skip
QWEN3_MOE = dataclasses.replace(TINY, num_experts=4, experts_per_token=2, expert_mlp_dim=16)


@pytest.mark.parametrize("config", [GEMMA4, QWEN3_MOE], ids=["gemma4_window", "qwen3_moe"])
@pytest.mark.slow
def test_paged_cache_gives_the_dense_caches_completions_with_windows_and_experts(config, prompts):
    """Gemma4's local layers attend over the last 4 tokens of their pages (rows longer than
    the window), its global layer over all; a MoE's routed MLP sees the same rows. A pool
    of one row at its caps, so rows also wait and are preempted."""
    model = build_model(config, seed=0)
    expected = generate(make_engine(model, paged=False), prompts, GREEDY)
    for pages in (None, ROW_PAGES):
        got = generate(make_engine(model, paged=True, pages=pages), prompts, GREEDY)
        assert_same_completions(got, expected)
