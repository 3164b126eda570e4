"""`model.compute_dtype`: bfloat16 activations over float32 weights (MaxText's trainer, the
paper's single-controller arm on NuminaMath and SWE), separate from `model.param_dtype`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from locoexp.compose import compose_config
from locoexp.errors import ConfigError
from locoexp.model.config import DType, ModelConfig
from locoexp.model.transformer import Transformer
from locoexp.planner import resolve_plan
from locoexp.rollout.config import RolloutConfig
from locoexp.rollout.engine import JaxEngine
from locoexp.session.build import plan_setup
from locoexp.trainer.trainer import BLOCKWISE

MIXED = ModelConfig(compute_dtype=DType.bfloat16)


def forward(config: ModelConfig):
    model = Transformer(config, rngs=nnx.Rngs(0))
    tokens = jnp.arange(32, dtype=jnp.int32).reshape(2, 16) % config.vocab_size
    positions = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (2, 16))
    segments = jnp.ones((2, 16), jnp.int32)
    hidden = model.packed_hidden(tokens, positions, segments, attention=BLOCKWISE)
    return model, hidden


def test_bfloat16_activations_keep_float32_weights_and_follow_the_float32_model():
    model, hidden = forward(MIXED)
    _, reference = forward(ModelConfig())
    weights = {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert weights == {jnp.dtype(jnp.float32)}  # what AdamW updates and checkpoints hold
    assert hidden.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(hidden, np.float32), reference, atol=0.1, rtol=0.05)
    assert not np.allclose(np.asarray(hidden, np.float32), reference, atol=1e-6)  # not fp32


def test_the_plan_counts_activations_at_the_compute_dtype():
    base = ["model=tiny_qwen", "dataset=gsm8k", "hardware=tpu_v7x_8", "trainer.accumulate=false"]
    fp32 = resolve_plan(plan_setup(compose_config(base))).trainer
    mixed = resolve_plan(plan_setup(compose_config([*base, "model.compute_dtype=bfloat16"])))
    assert mixed.trainer.params == fp32.params and mixed.trainer.optimizer == fp32.optimizer
    assert mixed.trainer.activations < 0.8 * fp32.activations


def test_the_engine_computes_in_its_own_weights_dtype():
    model = Transformer(MIXED, rngs=nnx.Rngs(0))
    engine = JaxEngine(model, RolloutConfig(), eos_id=0, pad_id=0, devices=jax.local_devices())
    assert engine.model_config.compute_dtype is None
    assert engine.model_config.activation_dtype is DType.float32


def test_compute_dtype_on_a_model_that_does_not_read_it_is_refused():
    with pytest.raises(
        ConfigError, match="model.compute_dtype=bfloat16 is not read by this run .* dense qwen3"
    ):
        compose_config(["model=tiny_qwen3_moe", "model.compute_dtype=bfloat16"])
    assert (
        MIXED.activation_dtype is DType.bfloat16 and ModelConfig().activation_dtype is DType.float32
    )
