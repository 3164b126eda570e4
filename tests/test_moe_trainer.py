"""The GRPO train step of a mixture-of-experts policy: the router's load-balancing loss enters
the loss with `model.router_aux_loss_coef` and reaches the router's gradient, and micro-batches
give the one-shot step's gradient when the router loss is off."""

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from locoexp.algo.config import AlgoConfig
from locoexp.model.config import Family, ModelConfig
from locoexp.model.transformer import build_model
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.packing import pack_sequences
from locoexp.trainer.trainer import Trainer

MOE = ModelConfig(
    vocab_size=32, num_layers=2, hidden_dim=32, mlp_dim=64, num_heads=4, num_kv_heads=2,
    head_dim=8, init_std=0.3, num_experts=4, experts_per_token=2, expert_mlp_dim=16,
    router_aux_loss_coef=0.01,
)  # fmt: skip
GEMMA4_MOE = dataclasses.replace(
    MOE, family=Family.gemma4, num_layers=3, sliding_window=4, global_attention_every=3,
    global_head_dim=16, global_kv_heads=1, global_rotary_fraction=0.25, global_key_is_value=True,
    final_logit_softcap=30.0,
)  # fmt: skip
CONFIGS = pytest.mark.parametrize("config", [MOE, GEMMA4_MOE], ids=["qwen3_moe", "gemma4_moe"])
MAX_NEW = 6


def packed_batch():
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 32, size=n).astype(np.int32) for n in (3, 5, 4, 6)]
    completions = [rng.integers(1, 32, size=n).astype(np.int32) for n in (6, 4, 5, 3)]
    behaviour = [np.full(len(c), -1.0, np.float32) for c in completions]
    advantages = np.array([1.0, -1.0, 0.5, -0.5], np.float32)
    return pack_sequences(prompts, completions, behaviour, advantages, row_tokens=16)


def trainer(config: ModelConfig, *, micro_batch_rows: int = 0) -> Trainer:
    return Trainer(
        build_model(config, seed=0),
        AlgoConfig(learning_rate=1e-2),
        TrainerConfig(micro_batch_rows=micro_batch_rows),
        mesh=Mesh(np.array(jax.devices()[:1]), ("fsdp",)),
        temperature=1.0,
        max_new_tokens=MAX_NEW,
    )


_RESULTS: dict[tuple[str, int], tuple] = {}


def loss_and_grads(config: ModelConfig, *, micro_batch_rows: int = 0):
    """((loss, metrics), gradients) of a fresh trainer on `packed_batch()`, once per module."""
    key = (repr(config), micro_batch_rows)
    if key not in _RESULTS:
        model = trainer(config, micro_batch_rows=micro_batch_rows)
        _RESULTS[key] = model.loss_and_grads(packed_batch())
    return _RESULTS[key]


@CONFIGS
@pytest.mark.parametrize("micro_batch_rows", [0, 1])
@pytest.mark.slow
def test_router_loss_enters_the_grpo_loss_with_its_coefficient(config, micro_batch_rows):
    off = dataclasses.replace(config, router_aux_loss_coef=0.0)
    (loss_on, metrics_on), grads_on = loss_and_grads(config, micro_batch_rows=micro_batch_rows)
    (loss_off, metrics_off), grads_off = loss_and_grads(off)
    router = float(metrics_on["train/router_loss"])
    assert router > 0.0
    if micro_batch_rows == 0:  # one micro-batch: the whole batch's statistic, exactly
        np.testing.assert_allclose(router, float(metrics_off["train/router_loss"]), rtol=1e-6)
    np.testing.assert_allclose(
        float(loss_on) - float(loss_off), 0.01 * router, rtol=1e-4 if micro_batch_rows else 1e-5
    )
    owner = "experts" if config.gemma4 else "mlp"
    router_grad = lambda g: np.asarray(g["layers"][0][owner]["router"])  # noqa: E731
    assert np.abs(router_grad(grads_on) - router_grad(grads_off)).max() > 1e-6


@CONFIGS
def test_micro_batches_give_the_one_shot_gradient_without_router_loss(config):
    config = dataclasses.replace(config, router_aux_loss_coef=0.0)
    (loss_one, _), grads_one = loss_and_grads(config)
    (loss_micro, _), grads_micro = loss_and_grads(config, micro_batch_rows=1)
    np.testing.assert_allclose(float(loss_micro), float(loss_one), atol=1e-6)
    for a, b in zip(jax.tree.leaves(grads_micro), jax.tree.leaves(grads_one), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@CONFIGS
@pytest.mark.slow
def test_a_moe_train_step_runs_and_reports_the_router_loss(config):
    metrics = trainer(config).train_step(packed_batch())
    assert np.isfinite(metrics["train/loss"]) and metrics["train/router_loss"] > 0.0
