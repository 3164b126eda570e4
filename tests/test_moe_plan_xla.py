"""The memory plan's expert terms against XLA, as tests/test_planner_xla.py checks the dense plan
and within its tolerance: a tiny Qwen3-MoE's train step and generation wave on one CPU device, where
the routed tokens' buffers are a large share of the footprint. XLA on CPU lowers `ragged_dot` as a
masked matmul against every expert, which the train step keeps for its backward pass
(`estimate._routed_per_token`'s `dense_groups`); the engine's forward-only programs do not."""

import jax
import pytest
from test_planner_xla import TOLERANCE, compiled_train_step, compiled_wave, footprint, trainer_shape

from locoexp.model.config import ModelConfig
from locoexp.model.sizes import count_parameters_by_formula
from locoexp.planner.estimate import EngineShape, estimate_engine, estimate_trainer
from locoexp.trainer.config import AttentionKind, TrainerConfig

pytestmark = pytest.mark.slow  # compiles MoE train steps (minutes on a loaded 2-core machine)

QWEN3_MOE = ModelConfig(
    vocab_size=512, num_layers=2, hidden_dim=64, mlp_dim=192, num_heads=4, num_kv_heads=2,
    head_dim=16, num_experts=8, experts_per_token=2, expert_mlp_dim=96,
)  # fmt: skip
CPU = jax.default_backend() == "cpu"


def test_moe_train_step_estimate_is_within_tolerance_of_xla():
    """Plan / XLA 0.88 when written (XLA 126.6 MB, 2 rows x 4 of 256 tokens); 0.40 without
    the routed buffers' masked products."""
    config = TrainerConfig(attention=AttentionKind.blockwise, attention_block_tokens=128)
    rows, row_tokens, slots = 8, 256, 512
    shape = trainer_shape(config, rows, row_tokens, slots, cpu=CPU)
    planned = estimate_trainer(QWEN3_MOE, count_parameters_by_formula(QWEN3_MOE), shape).total
    measured = footprint(compiled_train_step(QWEN3_MOE, config, rows, row_tokens, slots))
    print(f"train step qwen3-moe: plan {planned} B, XLA {measured} B, {planned / measured:.3f}")
    assert abs(planned / measured - 1) <= TOLERANCE, (planned, measured)


def test_moe_generation_wave_estimate_is_within_tolerance_of_xla():
    """Plan / XLA 0.92 when written (XLA 8.0 MB); 1.07 since a prefill chunk's scores span
    the prompt's slots and the plan counts the one masked expert product XLA on CPU keeps (XLA
    8.3 MB)."""
    model = QWEN3_MOE
    rows, prompt, new = 16, 64, 64
    shape = EngineShape(
        tensor_parallel=1,
        sequences_per_replica=rows,
        prompt_tokens=prompt,
        new_tokens=new,
        prefill_chunk=prompt // 2,
        dtype=model.param_dtype,
        float32_matmuls=CPU,
    )
    planned = estimate_engine(model, shape).total
    measured = compiled_wave(model, rows, prompt, new, prompt // 2)
    print(f"generate qwen3-moe: plan {planned} B, XLA {measured} B")
    assert abs(planned / measured - 1) <= TOLERANCE, (planned, measured)
