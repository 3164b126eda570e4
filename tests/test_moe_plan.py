"""The plan counts a mixture-of-experts engine replica exactly: at EP1 the experts are replicated
on every device of a tensor-parallel replica, only attention and dense-MLP kernels and the
vocabulary are split, so
Gemma4-26B's float32 weights alone fill a v7x device at TP1; at EP e each device holds E/e of
every expert stack, and the dry run of Gemma4-26B on 64 chips fits at the EP it resolves."""

from model_options import load_model_option

from locoexp.model import sizes
from locoexp.planner.estimate import _engine_weight_elements
from locoexp.planner.report import describe_plan
from locoexp.session.build import plan_setup


def test_a_tp1_replica_holds_every_parameter():
    for name in ("qwen3_30b_a3b", "gemma4_26b"):
        config = load_model_option(name)
        assert _engine_weight_elements(config, 1) == sizes.count_parameters(config)


def test_tp4_splits_the_attention_kernels_and_the_vocabulary_of_qwen3_30b_a3b():
    """The experts stay whole (EP1); the untied embedding and head split by vocabulary."""
    config = load_model_option("qwen3_30b_a3b")
    attention_kernels = 2048 * 128 * (2 * 32 + 2 * 4)  # q, o, k, v per layer (t <= 4 KV heads)
    split_away = (48 * attention_kernels + sizes.count_embedding_parameters(config)) * 3 // 4
    assert not config.tie_embeddings
    assert _engine_weight_elements(config, 4) == sizes.count_parameters(config) - split_away


def test_gemma4_26b_fp32_weights_alone_fill_a_v7x_device_at_tp1():
    """94.0 GiB of the device's 94.7 (the plan then refuses it and names bfloat16)."""
    config = load_model_option("gemma4_26b")
    assert 93.9 < _engine_weight_elements(config, 1) * 4 / 2**30 < 94.1


def test_ep8_holds_an_eighth_of_every_expert_stack():
    config = load_model_option("gemma4_26b")
    experts = sizes.count_expert_parameters(config)  # every [E, ...] stack
    assert (
        _engine_weight_elements(config, 1, 8) == sizes.count_parameters(config) - experts * 7 // 8
    )


def test_gemma4_26b_on_64_chips_fits_with_expert_parallelism_named(compose):
    """`python run.py model=gemma4_26b hardware=tpu_v7x_64 dry_run=true`: EP8 over each
    host's 8 devices (rollout.expert_parallel=0 resolved), in float32."""
    report = describe_plan(plan_setup(compose(["model=gemma4_26b", "hardware=tpu_v7x_64"])))
    assert "placement: colocated; fits" in report
    assert "EP8 (rollout.expert_parallel=0: the most that divide; 16 experts per device)" in report
    assert "FSDP128 x EP1 (trainer.expert_parallel)" in report
