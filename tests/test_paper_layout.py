"""The paper's trainer layout (`trainer.accumulate=false`): one pass and one update over the
whole per-device batch, no micro-batch accumulation (Section 4.2). The plan sizes it, refuses
what does not fit, and a default run that fits only by accumulating says so in its dry run.
"""

import pytest

from locoexp.compose import compose_config
from locoexp.errors import ConfigError
from locoexp.planner import check_fit, resolve_plan
from locoexp.planner.estimate import GIB
from locoexp.planner.report import verdict_of
from locoexp.session.build import build_spec, plan_setup

# Table 3: LoCoJAX does not fit SWE at 8 chips, colocated
SWE_CO_8 = [
    "model=qwen3_0_6b",
    "dataset=swe_agent",
    "hardware=tpu_v7x_8",
    "placement=co",
    "rollout=vllm",
    "dry_run=true",
]


def test_micro_batch_rows_with_the_paper_layout_is_refused_naming_both_keys():
    with pytest.raises(ConfigError, match=r"trainer.micro_batch_rows=2 .* trainer.accumulate=tr"):
        compose_config(["trainer.accumulate=false", "trainer.micro_batch_rows=2"])


def test_the_paper_layout_plans_every_row_in_one_micro_batch():
    setup = plan_setup(compose_config([*SWE_CO_8, "trainer.accumulate=false"]))
    plan = resolve_plan(setup)
    assert plan.trainer_shape.micro_batches == 1
    # SWE's real mean sequence (dataset.mean_sequence_tokens, 6,885 tokens): 2,048 x 6,885 /
    # 16 devices in rows of 16,384 tokens; at the caps every row of 128
    assert plan.trainer_shape.micro_batch_rows == plan.trainer_shape.rows == 54
    caps = compose_config(
        [*SWE_CO_8, "trainer.accumulate=false", "dataset.mean_sequence_tokens=null"]
    )
    assert resolve_plan(plan_setup(caps)).trainer_shape.rows == 128


def test_swe_co_at_8_chips_fits_only_by_accumulating_and_says_so():
    config = compose_config(SWE_CO_8)
    verdict = verdict_of(plan_setup(config))
    assert verdict.startswith("fits with gradient accumulation (128 micro-batches); the paper's")
    need = float(verdict.split("needs ")[1].split(" GiB")[0])
    assert need > 94.7  # Table 3: 157.6 of 94.7 GiB per device
    paper = compose_config([*SWE_CO_8, "trainer.accumulate=false"])
    with pytest.raises(ConfigError, match="does not fit: the trainer needs .* fits with trainer"):
        check_fit(plan_setup(paper))


def test_a_run_under_the_paper_layout_keeps_one_micro_batch_once_planned():
    # GSM8K at 64 chips fits the paper's trainer with remat (Table 3 ran it); the resolved config
    # keeps micro_batch_rows=0 (every row in one pass) rather than a row count
    config = compose_config(
        [
            "model=qwen3_0_6b",
            "dataset=gsm8k",
            "model.param_dtype=bfloat16",
            "hardware=tpu_v7x_64",
            "placement=co",
            "rollout=vllm",
            "trainer.accumulate=false",
            "trainer.remat=block",
        ]
    )
    resolved = build_spec(config).halves
    assert resolved.trainer.micro_batch_rows == 0 and not resolved.trainer.accumulate
    assert resolve_plan(plan_setup(config)).trainer_peak < 94.7 * GIB


def test_a_run_capped_per_replica_builds_at_the_capacity_the_cap_allows():
    # Table 3's engines held 64 sequences per replica (vLLM's max_num_seqs): GSM8K's 1,024
    # requests per 8-replica engine at 8 chips run as two waves of 512; the built run fixes that
    # capacity (and drops the cap it honoured) instead of refusing the pair as a user's
    config = compose_config(
        [
            "model=qwen3_0_6b",
            "dataset=gsm8k",
            "model.param_dtype=bfloat16",
            "hardware=tpu_v7x_8",
            "placement=co",
            "rollout=vllm",
            "rollout.data_parallel=8",
            "rollout.max_sequences_per_replica=64",
            "trainer.accumulate=false",
            "trainer.remat=block",
        ]
    )
    rollout = build_spec(config).halves.rollout
    assert (rollout.capacity, rollout.max_sequences_per_replica) == (512, 0)
