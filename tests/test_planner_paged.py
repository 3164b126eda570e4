"""The memory plan of a paged KV cache (issue 42 item 1, locoexp/planner/pages.py): the pool's
bytes, the slots it holds at the expected row, the one-row-at-its-caps floor, a given pool
against the plan's, the dry-run line, and more slots than dense when rows are shorter than
the caps. Plan arithmetic only: nothing is compiled or run."""

import dataclasses

import pytest
from model_options import load_model_option
from test_memory import TINY, cpu, setup, tpu_v7x

from locoexp.dataset.config import DatasetConfig
from locoexp.errors import ConfigError
from locoexp.planner import check_fit, describe_plan, fit
from locoexp.rollout.config import KVCacheKind, RolloutConfig, Scheduler
from locoexp.rollout.pages import pages_for

# 128 requests of 3 + 5 tokens at most: 2 pages of 4 tokens at the caps, 1 for a 4-token row
SHORT = DatasetConfig(prompts_per_step=32, samples_per_prompt=4, max_prompt_tokens=3,
                      max_new_tokens=5)  # fmt: skip
TINY_KV_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # layers x (k, v) x KV heads x head_dim x fp32
# Table 1's NuminaMath (256 x 8, caps 4,096 / 8,192) at the 250 cn_k12 rows' mean row (prompt
# and reference solution, Qwen3 tokens: tools/bench_paged_slots.py)
NUMINA = DatasetConfig(prompts_per_step=256, samples_per_prompt=8, max_prompt_tokens=4096,
                       max_new_tokens=8192)  # fmt: skip


def paged(pages: int | None = None, **kw) -> RolloutConfig:
    return RolloutConfig(
        kv_cache=KVCacheKind.paged, page_tokens=4, kv_cache_pages_per_replica=pages, **kw
    )


def with_mean(dataset: DatasetConfig, mean: int | None) -> DatasetConfig:
    return dataclasses.replace(dataset, mean_sequence_tokens=mean)


def test_the_pool_costs_its_pages_at_the_dense_caches_bytes_per_token():
    plan = fit.resolve_plan(setup(TINY, cpu(1), SHORT, rollout=paged(64)))
    assert plan.pool is not None and plan.pool.pages == 64 and plan.pool.given
    assert plan.engine.kv_cache == plan.pool.bytes_per_device == 64 * 4 * TINY_KV_PER_TOKEN
    # a paged compaction hands its donated pools back in place; a dense compaction's narrower
    # cache holds at most half the slots beside the whole one
    assert plan.engine.compaction == 0
    dense = fit.resolve_plan(setup(TINY, cpu(1), SHORT))
    assert dense.pool is None and dense.engine.compaction == dense.engine.kv_cache // 2
    waves = RolloutConfig(kv_cache=KVCacheKind.paged, scheduler=Scheduler.waves)
    assert fit.resolve_plan(setup(TINY, cpu(1), SHORT, rollout=waves)).engine.compaction == 0


def test_a_given_pool_sizes_the_slots_by_the_expected_row():
    # 64 pages: 64 rows of one page (a mean of 4 tokens), 32 at the caps' two pages
    short = fit.resolve_plan(setup(TINY, cpu(1), with_mean(SHORT, 4), rollout=paged(64)))
    assert short.pool.expected_row_tokens == 4 and short.pool.expected_rows == 64
    assert (short.capacity, short.waves) == (64, 2)
    assert short.pool.expected_source == "dataset.mean_sequence_tokens=4"
    caps = fit.resolve_plan(setup(TINY, cpu(1), SHORT, rollout=paged(64)))
    assert caps.pool.expected_row_tokens == 8 and "the caps" in caps.pool.expected_source
    assert (caps.capacity, caps.waves) == (32, 4)
    beyond = fit.resolve_plan(setup(TINY, cpu(1), with_mean(SHORT, 99), rollout=paged(64)))
    assert beyond.pool.expected_row_tokens == 8 and "is beyond them" in beyond.pool.expected_source


def test_a_pool_that_cannot_hold_one_row_at_its_caps_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"one row at its caps \(8 tokens\) needs 2"):
        check_fit(setup(TINY, cpu(1), SHORT, rollout=paged(1)))
    # the plan's own pool: what a device has left beside the weights cannot hold one row
    plan = fit.resolve_plan(setup(TINY, cpu(1, gib=0.0006), SHORT, rollout=paged()))
    assert not plan.pool.holds_one_row_at_caps and not fit.fits(plan, cpu(1, gib=0.0006))[1]


def test_a_null_pool_fills_an_accelerators_memory_up_to_every_slot_at_its_caps():
    model, hardware = load_model_option("qwen3_0_6b"), tpu_v7x(8)
    plan = fit.resolve_plan(setup(model, hardware, with_mean(NUMINA, 460), rollout=paged()))
    s = plan.engine_shape
    at_caps = s.sequences_per_replica * pages_for(s.prompt_tokens + s.new_tokens, 4)
    assert not plan.pool.given and plan.pool.pages < at_caps
    page_bytes = plan.pool.bytes_per_device // plan.pool.pages
    assert 0 <= int(94.7 * 2**30) - plan.engine_peak < page_bytes  # filled to the last page
    # a shared CPU machine: the engine's own null, every slot at its caps
    shared = fit.resolve_plan(setup(TINY, cpu(1, gib=None), SHORT, rollout=paged()))
    s = shared.engine_shape
    assert shared.pool.pages == s.sequences_per_replica * pages_for(s.prompt_tokens + 5, 4)


def test_a_paged_plan_gives_more_slots_than_dense_when_rows_are_shorter_than_the_caps():
    model, hardware = load_model_option("qwen3_0_6b"), tpu_v7x(8)

    def slots(dataset: DatasetConfig, rollout: RolloutConfig) -> int:
        plan_setup = setup(model, hardware, dataset, rollout=rollout)
        micro = fit.resolve_plan(plan_setup).trainer_shape.micro_batch_rows
        return fit.most_per_replica(plan_setup, micro=micro, most=1 << 12)

    dense = slots(with_mean(NUMINA, 460), RolloutConfig())
    assert slots(NUMINA, RolloutConfig()) == dense  # the dense cache reserves the caps anyway
    assert slots(with_mean(NUMINA, 460), paged()) >= 2 * dense  # issue 42's target
    # at the caps the pool holds what the dense cache does (its compaction copies no pool)
    assert slots(NUMINA, paged()) >= dense


def test_the_dry_run_states_pages_pool_expected_row_and_its_source_slots_and_waves():
    rollout = RolloutConfig(kv_cache=KVCacheKind.paged)  # 16-token pages, the plan's pool
    text = describe_plan(setup(load_model_option("qwen3_0_6b"), tpu_v7x(8), with_mean(NUMINA, 460),
                               rollout=rollout))  # fmt: skip
    line = next(x for x in text.splitlines() if x.startswith("paged KV cache"))
    assert "pages of 16 tokens per replica (rollout.kv_cache_pages_per_replica=null" in line
    assert "GiB per device; expected row 460 tokens (dataset.mean_sequence_tokens=460), 29 " in line
    assert "slots per replica" in line and "per engine" in line and "waves" in line
    assert "not a promise" in line and "preempts a row and recomputes it" in line
    assert "KV pool" in text and text.endswith("fits")


def test_the_resolved_rollout_takes_the_plans_pool_only_where_left_null():
    assert paged().at_capacity(8, pool_pages=40).kv_cache_pages_per_replica == 40
    assert paged(12).at_capacity(8, pool_pages=40).kv_cache_pages_per_replica == 12
    assert RolloutConfig().at_capacity(8, pool_pages=40).kv_cache_pages_per_replica is None
    assert paged().at_capacity(8, pool_pages=0).kv_cache_pages_per_replica is None
