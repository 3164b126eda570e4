"""Per-device memory estimates, the start-up fit and TP refusals, and the dry-run plan."""

import dataclasses
import re

import pytest
from model_options import load_model_option

from locoexp.dataset.config import DatasetConfig
from locoexp.errors import ConfigError
from locoexp.hardware.config import ChipKind, HardwareConfig
from locoexp.model import memory
from locoexp.model.config import DType, ModelConfig
from locoexp.model.sizes import count_parameters
from locoexp.rollout.config import RolloutConfig
from locoexp.trainer.config import TrainerConfig

TRAINER = TrainerConfig()
TINY = ModelConfig()  # V16, 2 layers, D64, F192, 4 q heads / 2 KV heads, h16, qk norm, tied, fp32
SWE = DatasetConfig(
    prompts_per_step=256, samples_per_prompt=8, max_prompt_tokens=15360, max_new_tokens=1024
)  # Table 1
SMALL = DatasetConfig(
    prompts_per_step=64, samples_per_prompt=8, max_prompt_tokens=256, max_new_tokens=768
)


def tpu_v7x(chips: int) -> HardwareConfig:
    """Section 3: 4 chips per host, 2 TensorCores (JAX devices) per chip, ~94.7 GiB each."""
    return HardwareConfig(
        chip=ChipKind.tpu_v7x,
        hosts=chips // 4,
        chips_per_host=4,
        devices_per_chip=2,
        memory_per_device_gib=94.7,
    )


def colocated(hardware: HardwareConfig) -> memory.Roles:
    return memory.Roles(trainer_hosts=hardware.hosts, rollout_hosts=hardware.hosts, colocated=True)


def test_trainer_terms_equal_the_hand_computed_formula():
    dataset = DatasetConfig(
        prompts_per_step=2, samples_per_prompt=2, max_prompt_tokens=3, max_new_tokens=5
    )
    t = memory.estimate_trainer_memory(TINY, dataset, TRAINER, devices=2)
    n = count_parameters(TINY)
    assert n == 99_712
    assert (t.rows, t.row_tokens) == (2, 8)  # 4 sequences over 2 devices, 3 + 5 tokens each
    assert t.params == t.gradients == n // 2 * 4 and t.optimizer == 2 * t.params
    assert t.reference == 0 and t.gathered_block == 49_312 * 4
    # Per token and layer: 4D + 2(H+K)h (q/k before the norm and after RoPE) + Kh + Hh + 3F,
    # fp32; dense attention probs H*L fp32 and the bool mask L; then the final norm in/out 2D.
    per_layer = (4 * 64 + 2 * 6 * 16 + 2 * 16 + 4 * 16 + 3 * 192) * 4 + 4 * 8 * 4 + 8
    per_token = 2 * per_layer + 2 * 64 * 4
    # Head: 20 loss slots split over 2 devices (D fp32 each), one 20-slot chunk of V fp32 logits
    # and their gradient.
    head = 10 * 64 * 4 + 2 * 20 * 16 * 4
    assert t.activations == 2 * 8 * per_token + head
    kl = memory.estimate_trainer_memory(TINY, dataset, TRAINER, devices=2, reference_policy=True)
    assert kl.reference == t.params and kl.resident == t.resident + t.params


def test_engine_terms_equal_the_hand_computed_formula():
    dataset = DatasetConfig(
        prompts_per_step=2, samples_per_prompt=2, max_prompt_tokens=3, max_new_tokens=5
    )
    e = memory.estimate_engine_memory(TINY, dataset, RolloutConfig(), engine_devices=1, engines=1)
    assert (e.replicas_per_engine, e.sequences_per_replica) == (1, 4)
    assert e.weights == count_parameters(TINY) * 4
    # 3 prompt tokens padded to the 16-token bucket + 5 new = 21 slots per sequence.
    assert e.kv_cache == 4 * 21 * (2 * 2 * 2 * 16 * 4)  # seqs x S x (layers x k,v x K x h x fp32)
    assert e.prefill_scores == 4 * 4 * 16 * 21 * 4  # seqs x H x P' x S x fp32
    half = memory.estimate_engine_memory(
        TINY, dataset, RolloutConfig(tensor_parallel=2), engine_devices=2, engines=1
    )
    assert (half.weights, half.kv_cache) == (e.weights // 2, e.kv_cache // 2)
    assert half.prefill_scores == e.prefill_scores // 2


def test_longer_rows_pack_several_sequences_at_the_caps():
    longer = TrainerConfig(row_tokens=4 * (256 + 768))  # four sequences at the caps per row
    default = memory.estimate_trainer_memory(TINY, SMALL, TRAINER, devices=4)
    packed = memory.estimate_trainer_memory(TINY, SMALL, longer, devices=4)
    assert (default.rows, default.row_tokens) == (128, 1024)  # 512 sequences / 4 devices
    assert (packed.rows, packed.row_tokens) == (32, 4096)


def test_bfloat16_halves_every_term_but_the_float32_ones():
    bf16 = dataclasses.replace(TINY, param_dtype=DType.bfloat16)
    f32, b16 = (memory.estimate_trainer_memory(m, SMALL, TRAINER, devices=4) for m in (TINY, bf16))
    assert b16.params * 2 == f32.params and b16.optimizer * 2 == f32.optimizer
    assert f32.activations / 2 < b16.activations < f32.activations  # probs and logits stay fp32


def test_swe_at_8_chips_is_refused_in_the_papers_words():
    # The paper's case (Table 3): Qwen3-0.6B, fp32, SWE, 8 chips = 16 devices, no accumulation.
    hardware = tpu_v7x(8)
    with pytest.raises(ConfigError) as error:
        memory.check_fit(
            load_model_option("qwen3_0_6b"),
            hardware,
            RolloutConfig(),
            SWE,
            TRAINER,
            colocated(hardware),
        )
    assert re.match(
        r"does not fit: the trainer needs \d+\.\d GiB per device of 94\.7 ", str(error.value)
    )
    assert "dataset.max_prompt_tokens" in str(error.value)


def test_llama_405b_on_8_chips_is_refused_by_its_weights_alone():
    hardware = tpu_v7x(8)
    model = load_model_option("llama3_1_405b")
    t = memory.estimate_trainer_memory(model, DatasetConfig(), TRAINER, devices=hardware.devices)
    assert (t.params + t.gradients + t.optimizer) / memory.GIB > 94.7  # 16 bytes x 405.9B / 16
    rollout = RolloutConfig(tensor_parallel=8)
    with pytest.raises(ConfigError, match=r"^does not fit: the trainer needs"):
        memory.check_fit(model, hardware, rollout, DatasetConfig(), TRAINER, colocated(hardware))


def test_qwen3_0_6b_fits_a_v7x_slice():
    hardware = tpu_v7x(64)
    memory.check_fit(
        load_model_option("qwen3_0_6b"),
        hardware,
        RolloutConfig(),
        SMALL,
        TRAINER,
        colocated(hardware),
    )


def test_an_engine_too_small_for_its_weights_is_refused_in_the_papers_words():
    hardware = tpu_v7x(64)  # a disaggregated 8/8 split: the trainer fits, a TP1 32B replica not
    roles = memory.Roles(trainer_hosts=8, rollout_hosts=8, colocated=False)
    dataset = DatasetConfig(
        prompts_per_step=16, samples_per_prompt=4, max_prompt_tokens=64, max_new_tokens=64
    )
    with pytest.raises(
        ConfigError,
        match=r"^does not fit: the rollout engine needs \d+\.\d GiB per device of 94\.7 ",
    ):
        memory.check_fit(
            load_model_option("qwen3_32b"), hardware, RolloutConfig(), dataset, TRAINER, roles
        )
    memory.check_fit(
        load_model_option("qwen3_32b"),
        hardware,
        RolloutConfig(tensor_parallel=4),
        dataset,
        TRAINER,
        roles,
    )


def test_tp16_for_qwen3_14b_is_refused_naming_the_keys_and_the_valid_degrees():
    # The paper's case: 14B has 40 heads; a lockstep engine over all 256 TensorCores.
    hardware = tpu_v7x(128)
    roles = memory.Roles(trainer_hosts=32, rollout_hosts=32, colocated=True, hosts_per_engine=32)
    with pytest.raises(ConfigError) as error:
        memory.check_fit(
            load_model_option("qwen3_14b"),
            hardware,
            RolloutConfig(tensor_parallel=16),
            SMALL,
            TRAINER,
            roles,
        )
    assert str(error.value).startswith(
        "rollout.tensor_parallel=16 does not divide model.num_heads=40"
    )
    assert "1, 2, 4, 8." in str(error.value)


def test_tp_must_tile_a_host_local_engine():
    hardware = tpu_v7x(8)
    with pytest.raises(ConfigError, match="does not divide the 8 devices of a rollout engine"):
        memory.check_tensor_parallel(
            load_model_option("llama3_1_405b"),
            RolloutConfig(tensor_parallel=16),
            engine_devices=hardware.devices_per_host,
        )


def test_more_trainer_devices_need_less_memory_each():
    model = load_model_option("qwen3_0_6b")
    totals = [
        memory.estimate_trainer_memory(model, SMALL, TRAINER, devices=d).total for d in (16, 32, 64)
    ]
    assert totals[0] > totals[1] > totals[2]


def test_only_colocated_roles_share_a_device():
    hardware, model = tpu_v7x(16), load_model_option("qwen3_1_7b")
    co = memory.plan_memory(model, hardware, RolloutConfig(), SMALL, TRAINER, colocated(hardware))
    da = memory.plan_memory(
        model,
        hardware,
        RolloutConfig(),
        SMALL,
        TRAINER,
        memory.Roles(trainer_hosts=4, rollout_hosts=4, colocated=False),
    )
    assert co.trainer_peak == co.trainer.total + co.engine.weights
    assert co.engine_peak == co.engine.total + co.trainer.resident
    assert (da.trainer_peak, da.engine_peak) == (da.trainer.total, da.engine.total)


def test_dry_run_plan_names_hosts_devices_memory_and_parameters():
    hardware = tpu_v7x(64)
    text = memory.describe_plan(
        load_model_option("qwen3_0_6b"),
        hardware,
        RolloutConfig(),
        SMALL,
        TRAINER,
        colocated(hardware),
    )
    assert "0.596B parameters" in text and "16 hosts x 8 devices" in text
    assert "trainer: 16 hosts, 128 devices (FSDP)" in text and "DP8 x TP1" in text
    assert "GiB per device" in text and text.endswith("fits")


def test_default_tiny_run_fits_the_default_cpu_hardware():
    hardware = HardwareConfig()
    memory.check_fit(TINY, hardware, RolloutConfig(), DatasetConfig(), TRAINER, colocated(hardware))
