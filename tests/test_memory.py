"""The memory plan: per-device terms, the resolution of micro-batches and waves, the start-up fit
and TP refusals, shared CPU memory, and the dry-run report."""

import dataclasses
import re

import pytest
from model_options import load_model_option

from locoexp.dataset.config import DatasetConfig
from locoexp.errors import ConfigError
from locoexp.hardware.config import ChipKind, HardwareConfig
from locoexp.layout import Layout, PlacementKind, build_layout
from locoexp.model.config import DType, ModelConfig
from locoexp.model.sizes import count_parameters
from locoexp.planner import (
    Setup,
    check_fit,
    check_tensor_parallel,
    describe_plan,
    estimate,
    fit,
    plan,
)
from locoexp.rollout.config import RolloutConfig
from locoexp.trainer.config import AttentionKind, RematPolicy, TrainerConfig

TRAINER = TrainerConfig()
DENSE = TrainerConfig(attention=AttentionKind.dense, micro_batch_rows=1 << 20)
TINY = ModelConfig()  # V16, 2 layers, D64, F192, 4 q heads / 2 KV heads, h16, qk norm, tied, fp32
SWE = DatasetConfig(
    prompts_per_step=256, samples_per_prompt=8, max_prompt_tokens=15360, max_new_tokens=1024
)  # Table 1
SMALL = DatasetConfig(
    prompts_per_step=64, samples_per_prompt=8, max_prompt_tokens=256, max_new_tokens=768
)
FOUR = DatasetConfig(
    prompts_per_step=2, samples_per_prompt=2, max_prompt_tokens=3, max_new_tokens=5
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


def cpu(hosts: int, gib: float | None = 64.0) -> HardwareConfig:
    return HardwareConfig(hosts=hosts, memory_per_device_gib=gib)


def colocated(hardware: HardwareConfig) -> Layout:
    return build_layout(PlacementKind.co, hosts=hardware.hosts, devices_per_host=1)


def single_controller(hosts: int) -> Layout:
    return build_layout(PlacementKind.single_controller, hosts=hosts, devices_per_host=1)


def disaggregated(trainer_hosts: int, rollout_hosts: int) -> Layout:
    hosts = trainer_hosts + rollout_hosts
    return build_layout(
        PlacementKind.da, hosts=hosts, devices_per_host=1, split=trainer_hosts / hosts
    )


def setup(model, hardware, dataset, *, roles=None, rollout=None, trainer=TRAINER) -> Setup:
    return Setup(
        model=model,
        hardware=hardware,
        rollout=rollout or RolloutConfig(),
        dataset=dataset,
        trainer=trainer,
        layout=roles or colocated(hardware),
    )


def test_trainer_terms_equal_the_hand_computed_formula():
    p = fit.resolve_plan(setup(TINY, cpu(2), FOUR, trainer=DENSE))
    t, shape = p.trainer, p.trainer_shape
    n = count_parameters(TINY)
    assert n == 99_712
    assert (shape.devices, shape.rows, shape.row_tokens) == (2, 2, 8)  # 4 sequences, 3 + 5 tokens
    assert shape.micro_batches == 1 and t.gradients == t.params == n // 2 * 4
    assert t.optimizer == 2 * t.params and t.reference == 0 and t.gathered_block == 49_312 * 4
    # Per token and layer: 4D + 2(H+K)h (q/k before the norm and after RoPE) + Kh + Hh + 3F,
    # fp32; dense attention keeps 4 float32 [H, L] copies and the bool mask L; float32 copies
    # of the norms' inputs (2D) and of q and k for the q/k norm and RoPE (2(H+K)h), and silu's
    # sigmoid (F); then the final norm's input and output 2D.
    per_layer = (4 * 64 + 2 * 6 * 16 + 2 * 16 + 4 * 16 + 3 * 192) * 4 + 4 * 4 * 8 * 4 + 8
    per_layer += (2 * 64 + 2 * 6 * 16) * 4 + 192 * 4
    assert t.activations == 2 * 8 * (2 * per_layer + 2 * 64 * 4)
    # Head, run by each device on its own slots: its float32 [V, D] partial gradient and the
    # float32 weight, the reduce-scattered sum split over the 2 devices; 10 loss slots per
    # device, their hidden states and gradient (D fp32 each) and one 10-slot chunk of V float32
    # logits.
    assert t.head_gradient == 2.5 * 16 * 64 * 4 and t.head_chunk == 2 * 10 * 64 * 4 + 10 * 16 * 4
    transient = t.inputs + t.gathered_block + t.activations + t.head_gradient
    assert t.total == t.resident + transient + max(t.gradients, t.head_chunk)


def test_engine_terms_equal_the_hand_computed_formula():
    p = fit.resolve_plan(setup(TINY, cpu(1), FOUR))
    e = p.engine
    assert (p.replicas_per_engine, p.capacity, p.waves) == (1, 4, 1)
    assert e.weights == count_parameters(TINY) * 4
    # 3 prompt tokens padded to the 16-token bucket + 5 new = 21 slots per sequence.
    assert e.kv_cache == 4 * 21 * (2 * 2 * 2 * 16 * 4)  # seqs x S x (layers x k,v x K x h x fp32)
    # 2 copies x seqs x H x chunk x P x fp32, and the chunk loop's prompt cache of P slots
    assert e.prefill == 2 * 4 * 4 * 16 * 16 * 4 + e.kv_cache * 16 // 21
    assert e.decode == 2 * 4 * 16 * 4  # logits and log-softmax, seqs x V fp32
    roles = build_layout(PlacementKind.co, hosts=1, devices_per_host=1)
    half = fit.resolve_plan(
        setup(TINY, cpu(1), FOUR, roles=roles, rollout=RolloutConfig(tensor_parallel=2))
    )
    assert half.engine.kv_cache == e.kv_cache // 2 and half.engine.prefill == e.prefill // 2
    # per layer all but the norms' 2D + 2h scales, and the tied [V, D] embedding (by vocabulary)
    sharded = (2 * (49_312 - 160) + 16 * 64) * 4
    assert half.engine.weights == e.weights - sharded // 2  # the norms replicated


def test_longer_rows_pack_several_sequences_at_the_caps():
    longer = dataclasses.replace(DENSE, row_tokens=4 * (256 + 768))  # four sequences per row
    default = fit.resolve_plan(setup(TINY, cpu(4), SMALL, trainer=DENSE)).trainer_shape
    packed = fit.resolve_plan(setup(TINY, cpu(4), SMALL, trainer=longer)).trainer_shape
    assert (default.rows, default.row_tokens) == (128, 1024)  # 512 sequences / 4 devices
    assert (packed.rows, packed.row_tokens) == (32, 4096)


def test_bfloat16_halves_every_term_but_the_float32_ones():
    bf16 = dataclasses.replace(TINY, param_dtype=DType.bfloat16)
    f32, b16 = (
        fit.resolve_plan(setup(m, cpu(4), SMALL, trainer=DENSE)).trainer for m in (TINY, bf16)
    )
    assert b16.params * 2 == f32.params and b16.optimizer * 2 == f32.optimizer
    assert f32.activations / 2 < b16.activations < f32.activations  # scores stay fp32


def test_rematerialisation_and_blockwise_attention_shrink_activations():
    model = load_model_option("qwen3_0_6b")
    one_row = dataclasses.replace(TRAINER, micro_batch_rows=1)
    kinds = {
        "dense": dataclasses.replace(one_row, attention=AttentionKind.dense),
        "blockwise": one_row,
        "save_matmuls": dataclasses.replace(one_row, remat=RematPolicy.save_matmuls),
        "block": dataclasses.replace(one_row, remat=RematPolicy.block),
    }
    acts = {
        k: fit.resolve_plan(setup(model, tpu_v7x(64), SWE, trainer=t)).trainer.activations
        for k, t in kinds.items()
    }
    assert acts["dense"] > 5 * acts["blockwise"] > 5 * acts["block"]
    assert acts["blockwise"] > acts["save_matmuls"] > acts["block"]


def test_micro_batch_rows_resolve_to_the_most_that_fit():
    model = load_model_option("qwen3_0_6b")
    hardware = tpu_v7x(64)
    p = fit.resolve_plan(setup(model, hardware, SWE))
    limit = 94.7 * estimate.GIB
    assert (
        p.trainer_peak
        <= limit
        < fit.resolve_plan(
            setup(
                model,
                hardware,
                SWE,
                trainer=dataclasses.replace(
                    TRAINER, micro_batch_rows=2 * p.trainer_shape.micro_batch_rows
                ),
            )
        ).trainer_peak
    )
    # fp32: the float32 accumulator beside one micro-batch's gradients; each device runs the
    # head on its own slots inside each micro-batch's vjp, beside them: its partial [V, D]
    # float32 dLoss/dW and the float32 weight whole, the carried sum split over the devices,
    # one chunk's logits and the micro-batch's dLoss/dhidden
    t, m = p.trainer, p.trainer_shape.micro_batch_rows
    whole = 151_936 * 1024 * 4
    assert t.gradients == 2 * t.params and t.head_in_micro_batches
    assert t.head_gradient == 2 * whole + -(-whole // p.trainer_shape.devices)
    assert t.head_chunk == m * 16384 * 1024 * 4 + 512 * 151_936 * 4
    transient = t.inputs + t.gathered_block + t.activations + t.head_gradient
    assert t.total == t.resident + transient + t.gradients + t.head_chunk


def test_capacity_resolves_to_balanced_waves_that_fit():
    model = load_model_option("qwen3_0_6b")
    hardware = tpu_v7x(8)
    gsm8k = DatasetConfig(
        prompts_per_step=128, samples_per_prompt=16, max_prompt_tokens=512, max_new_tokens=2048
    )
    p = fit.resolve_plan(setup(model, hardware, gsm8k))
    assert p.engine_peak <= 94.7 * estimate.GIB
    assert p.capacity * p.waves >= p.requests_per_engine > p.capacity * (p.waves - 1)
    assert p.capacity % p.replicas_per_engine == 0 or p.capacity == p.requests_per_engine
    fixed = fit.resolve_plan(setup(model, hardware, gsm8k, rollout=RolloutConfig(capacity=64)))
    assert (fixed.capacity, fixed.waves) == (64, 16)  # 1,024 requests per host engine
    # vLLM's max_num_seqs per DP rank caps what the memory would hold (8 replicas per engine)
    capped = fit.resolve_plan(
        setup(model, hardware, gsm8k, rollout=RolloutConfig(max_sequences_per_replica=32))
    )
    assert p.capacity > 32 * 8 and (capped.capacity, capped.waves) == (32 * 8, 4)
    with pytest.raises(ConfigError, match=r"rollout.capacity=64 fixes it: set one of the two"):
        RolloutConfig(capacity=64, max_sequences_per_replica=64)


def test_swe_at_8_chips_without_accumulation_is_refused_naming_micro_batches_that_fit():
    # The paper's case (Table 3, Section 4.2): Qwen3-0.6B, fp32, SWE, 8 chips = 16 devices; its
    # trainer does not accumulate gradients, so the whole batch (128 rows per device) is live.
    model, hardware = load_model_option("qwen3_0_6b"), tpu_v7x(8)
    whole = dataclasses.replace(TRAINER, micro_batch_rows=128)
    with pytest.raises(ConfigError) as error:
        check_fit(setup(model, hardware, SWE, trainer=whole))
    message = str(error.value)
    assert re.match(r"does not fit: the trainer needs \d+\.\d GiB per device of 94\.7 ", message)
    assert re.search(
        r"it fits with trainer.micro_batch_rows=\d+ \(or 0, the most that fit\)", message
    )
    resolved = check_fit(setup(model, hardware, SWE))
    assert resolved.trainer_shape.micro_batches > 1


def test_llama_405b_on_8_chips_is_refused_by_its_weights_alone():
    hardware = tpu_v7x(8)
    model = load_model_option("llama3_1_405b")
    rollout = RolloutConfig(tensor_parallel=8)
    p = fit.resolve_plan(setup(model, hardware, DatasetConfig(), rollout=rollout))
    assert (p.trainer.params + p.trainer.optimizer) / estimate.GIB > 94.7  # 12 bytes x 405.9B / 16
    with pytest.raises(ConfigError, match=r"^does not fit: the trainer needs.*no single setting"):
        check_fit(setup(model, hardware, DatasetConfig(), rollout=rollout))


def test_qwen3_0_6b_fits_a_v7x_slice():
    check_fit(setup(load_model_option("qwen3_0_6b"), tpu_v7x(64), SMALL))


def test_an_engine_too_small_for_its_weights_is_refused_naming_a_tp_that_fits():
    # colocated on 64 chips, the engine's copy freed for training (Table H2): the FSDP trainer
    # fits, a TP1 float32 32B replica beside its shard of params and AdamW does not. (Under da
    # the trainer devices gather that whole replica to publish it, so there they are refused
    # first: test_da_on_cpu_counts_the_published_replica_and_the_object_store_it_is_sized_to.)
    hardware = tpu_v7x(64)
    dataset = DatasetConfig(
        prompts_per_step=16, samples_per_prompt=4, max_prompt_tokens=64, max_new_tokens=64
    )
    model = load_model_option("qwen3_32b")
    released = RolloutConfig(release_weights_during_training=True)
    with pytest.raises(ConfigError) as error:
        check_fit(setup(model, hardware, dataset, rollout=released))
    assert re.match(
        r"^does not fit: the rollout engine needs \d+\.\d GiB per device of 94\.7 ",
        str(error.value),
    )
    assert "rollout.tensor_parallel=2" in str(error.value)
    tp2 = dataclasses.replace(released, tensor_parallel=2)
    check_fit(setup(model, hardware, dataset, rollout=tp2))


def test_tp16_for_qwen3_14b_is_refused_naming_the_keys_and_the_valid_degrees():
    # The paper's case: 14B has 40 heads; a lockstep engine over all 256 TensorCores.
    hardware = tpu_v7x(128)
    roles = single_controller(hardware.hosts)
    with pytest.raises(ConfigError) as error:
        check_fit(
            setup(
                load_model_option("qwen3_14b"),
                hardware,
                SMALL,
                roles=roles,
                rollout=RolloutConfig(tensor_parallel=16),
            )
        )
    assert str(error.value).startswith(
        "rollout.tensor_parallel=16 does not divide model.num_heads=40"
    )
    assert "1, 2, 4, 8." in str(error.value)


def test_tp_must_tile_a_host_local_engine():
    with pytest.raises(ConfigError, match="does not divide the 8 devices of a rollout engine"):
        check_tensor_parallel(
            setup(
                load_model_option("llama3_1_405b"),
                tpu_v7x(8),
                SMALL,
                rollout=RolloutConfig(tensor_parallel=16),
            )
        )


def test_more_trainer_devices_need_less_memory_each():
    model = load_model_option("qwen3_0_6b")
    one = dataclasses.replace(TRAINER, micro_batch_rows=1)
    totals = [
        fit.resolve_plan(setup(model, tpu_v7x(c), SMALL, trainer=one)).trainer.total
        for c in (8, 16, 32)
    ]
    assert totals[0] > totals[1] > totals[2]


def test_only_colocated_roles_share_a_device():
    hardware, model = tpu_v7x(16), load_model_option("qwen3_1_7b")
    co = fit.resolve_plan(setup(model, hardware, SMALL))
    da = fit.resolve_plan(setup(model, hardware, SMALL, roles=disaggregated(2, 2)))
    assert co.trainer_peak == co.trainer.total + co.engine.weights
    assert co.engine_peak == co.engine.total + co.trainer.resident
    assert (da.trainer_peak, da.engine_peak) == (da.trainer.total, da.engine.total)


def test_released_engine_weights_leave_the_train_step_and_only_it():
    # rollout.release_weights_during_training (Table H2's 405B workaround): the colocated train
    # step no longer holds the engine's copy; generation is unchanged
    hardware, model = tpu_v7x(16), load_model_option("qwen3_1_7b")
    kept = plan.build_plan(setup(model, hardware, SMALL), micro=1, per_replica=8)
    freed = plan.build_plan(
        setup(model, hardware, SMALL, rollout=RolloutConfig(release_weights_during_training=True)),
        micro=1,
        per_replica=8,
    )
    assert freed.trainer_peak == kept.trainer_peak - kept.engine.weights == kept.trainer.total
    assert freed.engine_peak == kept.engine_peak
    released = setup(
        model, hardware, SMALL, rollout=RolloutConfig(release_weights_during_training=True)
    )
    assert "engine weights" not in describe_plan(released).split("rollout:")[0]
    assert "engine weights" in describe_plan(setup(model, hardware, SMALL)).split("rollout:")[0]


def test_uneven_da_shares_size_the_busiest_engine():
    # 128 prompts x 16 over 3 rollout hosts: 43, 43, 42 groups; the plan holds 43 x 16
    roles = disaggregated(1, 3)
    gsm = DatasetConfig(prompts_per_step=128, samples_per_prompt=16)
    assert setup(TINY, tpu_v7x(16), gsm, roles=roles).requests_per_engine == 43 * 16


def test_cpu_hosts_share_the_machine_and_the_plan_checks_their_sum():
    model = dataclasses.replace(load_model_option("qwen3_0_6b"), param_dtype=DType.bfloat16)
    gsm8k = DatasetConfig(
        prompts_per_step=4, samples_per_prompt=2, max_prompt_tokens=128, max_new_tokens=16
    )
    roles = disaggregated(1, 3)
    p = fit.resolve_plan(setup(model, cpu(4, gib=None), gsm8k, roles=roles))
    overhead = 5 * plan.PROCESS_OVERHEAD_GIB * estimate.GIB  # 4 hosts and the Ray driver
    store = plan.object_store_bytes(p.publication)  # Ray's, sized to the published versions
    assert p.machine_total == p.trainer_peak + 3 * p.engine_peak + overhead + store
    assert p.trainer_peak > 3 * p.engine.weights  # a trainer host is not a rollout host's share


def used_by_line(*, prompt_tokens: int, trainer: TrainerConfig = TRAINER) -> Setup:
    """`model=qwen3_0_6b dataset=gsm8k placement=da split=0.25` on CPU as session 10 ran it:
    bfloat16, 4 hosts (1 trainer, 3 rollout), 3 prompts x 2, 16 new tokens."""
    model = dataclasses.replace(load_model_option("qwen3_0_6b"), param_dtype=DType.bfloat16)
    gsm8k = DatasetConfig(
        prompts_per_step=3, samples_per_prompt=2, max_prompt_tokens=prompt_tokens, max_new_tokens=16
    )
    roles = disaggregated(1, 3)
    return setup(model, cpu(4, gib=None), gsm8k, roles=roles, trainer=trainer)


def test_on_a_shared_cpu_machine_the_fix_may_take_two_settings_together(monkeypatch):
    # the used-by line's shape with 1,024-token prompts, dense attention and float32 weights, on
    # a machine between what the two settings save together and what either saves alone:
    # the refusal names the pair (the plan proposes; the start-up compile confirms)
    dense = TrainerConfig(attention=AttentionKind.dense)
    base = used_by_line(prompt_tokens=1024, trainer=dense)
    base = dataclasses.replace(
        base, model=dataclasses.replace(base.model, param_dtype=DType.float32)
    )
    blockwise = dataclasses.replace(base, trainer=TrainerConfig())
    bf16 = dataclasses.replace(
        base, model=dataclasses.replace(base.model, param_dtype=DType.bfloat16)
    )
    both = dataclasses.replace(bf16, trainer=TrainerConfig())
    sizes = [fit.resolve_plan(s).machine_total for s in (base, blockwise, bf16, both)]
    assert sizes[0] > min(sizes[1:3]) and max(sizes[1:3]) > sizes[3]
    usable = (min(sizes[1:3]) + sizes[3]) / 2  # the pair fits, neither alone
    monkeypatch.setattr(
        plan, "machine_memory_gib", lambda: usable / plan.SHARED_MEMORY_USABLE / estimate.GIB
    )
    with pytest.raises(ConfigError) as refused:
        check_fit(base)
    message = str(refused.value)
    assert "fits with trainer.attention=blockwise model.param_dtype=bfloat16" in message, message
    assert "trainer.remat" not in message  # XLA on CPU folds remat back: not proposed there


def test_on_a_shared_cpu_machine_the_last_resort_is_fewer_copies_of_the_weights(monkeypatch):
    # the used-by line on a 23.5 GiB machine: its 4 hosts hold 4 copies of Qwen3-0.6B's weights
    # and no setting of either role, nor a smaller batch, fits them; 2 hosts (split=0.5) do
    monkeypatch.setattr(plan, "machine_memory_gib", lambda: 23.5)
    base = used_by_line(prompt_tokens=128)
    with pytest.raises(ConfigError, match=r"fits with hardware.hosts=2 split=0.5\.$"):
        check_fit(base)
    two = disaggregated(1, 1)
    one_prompt = dataclasses.replace(base.dataset, prompts_per_step=1)
    check_fit(setup(base.model, cpu(2, gib=None), one_prompt, roles=two))
    # GSM8K's 16 samples per prompt on a 20 GiB machine: not even 2 hosts and one prompt fit;
    # the refusal names the placement that holds the weights once, which does fit here (issue
    # 31: the next command runs)
    monkeypatch.setattr(plan, "machine_memory_gib", lambda: 20.0)
    sixteen = dataclasses.replace(
        base, dataset=dataclasses.replace(base.dataset, samples_per_prompt=16)
    )
    with pytest.raises(ConfigError, match="it fits with placement=co hardware.hosts=1 split=null"):
        check_fit(sixteen)


def test_da_on_cpu_counts_the_published_replica_and_the_object_store_it_is_sized_to():
    # a da trainer device gathers a whole replica in the sampler's dtype after its step, beside
    # its params and AdamW state; the local Ray cluster's object store is sized to three
    # published versions and the batches, and the machine's sum counts it
    model = dataclasses.replace(load_model_option("qwen3_0_6b"), param_dtype=DType.bfloat16)
    roles = disaggregated(1, 1)
    fp32 = RolloutConfig(param_dtype=DType.float32)
    p = fit.resolve_plan(setup(model, cpu(2, gib=None), FOUR, roles=roles, rollout=fp32))
    assert p.publication == estimate.publication_bytes(model, DType.float32)
    assert p.publication == p.engine.weights  # a TP1 engine holds the same replica
    store = plan.object_store_bytes(p.publication)
    assert store == 3 * p.publication + plan.OBJECT_STORE_HEADROOM
    overhead = 3 * plan.PROCESS_OVERHEAD_GIB * estimate.GIB  # 2 hosts and the Ray driver
    assert p.machine_total == p.trainer_peak + p.engine_peak + overhead + store
    assert p.trainer_peak >= p.trainer.resident + p.publication
    co = fit.resolve_plan(setup(model, cpu(2, gib=None), FOUR, rollout=fp32))
    assert co.publication == 0  # colocated: publication fills the engine's own copy


def test_dry_run_plan_names_hosts_devices_memory_waves_and_parameters():
    text = describe_plan(setup(load_model_option("qwen3_0_6b"), tpu_v7x(64), SMALL))
    assert "0.596B parameters" in text and "16 hosts x 8 devices" in text
    assert "trainer: 16 hosts, 128 devices (FSDP)" in text and "DP8 x TP1" in text
    batching = "continuously batched through 32 slots (rollout.capacity; static waves would take 1)"
    assert batching in text
    assert "micro-batch" in text and "GiB per device" in text and text.endswith("fits")


def test_default_tiny_run_fits_this_machine():
    hardware = HardwareConfig(hosts=1)
    check_fit(setup(TINY, hardware, DatasetConfig()))


def test_cpu_micro_batches_stop_at_the_activation_cap_and_accelerators_take_the_most_that_fit():
    # Table 1's GSM8K caps at 2 prompts x 4: 8 rows of 2,560 tokens on one device
    table1 = DatasetConfig(
        prompts_per_step=2, samples_per_prompt=4, max_prompt_tokens=512, max_new_tokens=2048
    )
    model = load_model_option("tiny_qwen")
    shared = fit.resolve_plan(setup(model, HardwareConfig(hosts=1), table1)).trainer_shape
    assert (shared.rows, shared.row_tokens) == (8, 2560)
    cap = fit.CPU_MICRO_BATCH_ACTIVATIONS_GIB * estimate.GIB
    assert shared.micro_batch_rows == 2  # 0.57 GiB of activations; 4 rows: 1.14 GiB
    assert shared.micro_batches == 4
    assert (
        fit.resolve_plan(setup(model, HardwareConfig(hosts=1), table1)).trainer.activations <= cap
    )
    own = fit.resolve_plan(setup(model, cpu(1, gib=64.0), table1)).trainer_shape
    assert own.micro_batch_rows == 8  # a device's own memory: the most that fit
    longest = dataclasses.replace(table1, max_prompt_tokens=15360, max_new_tokens=1024)
    one = fit.resolve_plan(setup(model, HardwareConfig(hosts=1), longest)).trainer_shape
    assert one.micro_batch_rows == 1  # a row over the cap still runs, one at a time
    assert (
        fit.resolve_plan(
            setup(TINY, HardwareConfig(hosts=1), DatasetConfig())
        ).trainer_shape.micro_batches
        == 1
    )  # the default run
