"""The trainer: its log-probs are the engine's, its steps move log-probs the way the advantages
say, the KL reference stays where it started, and the engine's weights survive its donation.

The engine and the trainer are built from one model, as `locoexp.main.run` builds them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh
from tiny_policy import PAD, random_prompts, tiny_model

from locoexp.algo.config import AlgoConfig, LossAggregation
from locoexp.algo.grpo import policy_loss
from locoexp.rollout.config import RolloutConfig, SamplingParams
from locoexp.rollout.engine import JaxEngine
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.packing import PackedBatch, pack_sequences, train_view
from locoexp.trainer.trainer import Trainer, token_logprobs

TEMPERATURE = 0.7
MAX_NEW = 8
N = 8


def build(*, kl_coef: float = 0.0, temperature: float = TEMPERATURE, chunk: int = 16):
    model = tiny_model(seed=0)
    engine = JaxEngine(
        model,
        RolloutConfig(prompt_bucket_tokens=1),
        eos_id=-1,
        pad_id=PAD,
        devices=jax.local_devices(),
    )
    algo = AlgoConfig(learning_rate=1e-2, kl_coef=kl_coef, max_grad_norm=1.0)
    trainer = Trainer(
        model,
        algo,
        TrainerConfig(logit_chunk_tokens=chunk),
        mesh=Mesh(np.array(jax.devices()), ("fsdp",)),
        temperature=temperature,
        max_new_tokens=MAX_NEW,
    )
    return engine, trainer


def rollout_batch(
    engine: JaxEngine, *, temperature: float, advantages: np.ndarray, key: int = 0
) -> PackedBatch:
    prompts = random_prompts([3, 5, 4, 6, 2, 7, 5, 3], seed=1)
    rollout = engine.generate(
        prompts,
        key=jax.random.key(key),
        max_new_tokens=MAX_NEW,
        sampling=SamplingParams(temperature=temperature),
    )
    completions = [rollout.completion(n) for n in range(N)]
    behaviour = [rollout.logprobs[n, : rollout.lengths[n]] for n in range(N)]
    return pack_sequences(prompts, completions, behaviour, advantages, row_tokens=32)


ADVANTAGES = np.array([1.0, -1.0] * (N // 2), np.float32)


@pytest.fixture(scope="module")
def trained():
    """Three steps on one fixed batch; what the engine and trainer said before and after."""
    engine, trainer = build()
    batch = rollout_batch(engine, temperature=TEMPERATURE, advantages=ADVANTAGES)
    engine_before = engine.generate(
        random_prompts([4, 6], seed=3),
        key=jax.random.key(1),
        max_new_tokens=MAX_NEW,
        sampling=SamplingParams(temperature=0.0),
    )
    before = trainer.logprobs(batch)
    metrics = [trainer.train_step(batch) for _ in range(3)]
    return {
        "engine": engine,
        "trainer": trainer,
        "batch": batch,
        "before": before,
        "after": trainer.logprobs(batch),
        "metrics": metrics,
        "engine_before": engine_before,
    }


def masked(values: np.ndarray, batch: PackedBatch) -> np.ndarray:
    return values[batch.loss_mask > 0]


def test_trainer_logprobs_equal_engine_behaviour_logprobs(trained):
    batch = trained["batch"]
    np.testing.assert_allclose(
        masked(trained["before"], batch), masked(batch.behaviour_logprobs, batch), atol=1e-5, rtol=0
    )


def test_first_step_loss_is_minus_mean_advantage_on_policy(trained):
    batch, first = trained["batch"], trained["metrics"][0]
    mask = batch.loss_mask
    # ratio 1, TIS weight 1 (the sampler is the trainer): loss = -sum(A) / tokens
    assert first["train/loss"] == pytest.approx(
        -(batch.advantages * mask).sum() / mask.sum(), abs=1e-5
    )
    assert first["train/clip_share"] == 0.0
    assert first["train/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)


def test_train_steps_lower_the_loss_on_a_fixed_batch(trained):
    batch, before, after = trained["batch"], trained["before"], trained["after"]

    def surrogate(logp):  # the clipped objective against the policy the steps started from
        return float(
            policy_loss(
                jnp.asarray(logp),
                jnp.asarray(before),
                jnp.asarray(batch.advantages),
                jnp.asarray(batch.loss_mask),
                clip_eps_low=0.2,
                clip_eps_high=0.2,
                aggregation=LossAggregation.token_mean,
                normalizer=1.0,
            )[0]
        )

    assert surrogate(after) < surrogate(before) - 1e-3
    positive = (batch.advantages > 0) & (batch.loss_mask > 0)
    negative = (batch.advantages < 0) & (batch.loss_mask > 0)
    assert after[positive].mean() > before[positive].mean()  # reinforced sequences more likely
    assert after[negative].mean() < before[negative].mean()  # penalised ones less likely


def test_engine_keeps_its_weights_while_the_trainer_steps(trained):
    """The train step donates the trainer's parameters; the engine built from the same model
    must still hold (and sample with) the original weights."""
    engine, before = trained["engine"], trained["engine_before"]
    again = engine.generate(
        random_prompts([4, 6], seed=3),
        key=jax.random.key(1),
        max_new_tokens=MAX_NEW,
        sampling=SamplingParams(temperature=0.0),
    )
    np.testing.assert_array_equal(again.tokens, before.tokens)
    np.testing.assert_allclose(again.logprobs, before.logprobs, atol=1e-6)


def test_published_weights_make_engine_logprobs_equal_trainer_logprobs(trained):
    engine, trainer = trained["engine"], trained["trainer"]
    engine.load_weights(trainer.params)
    batch = rollout_batch(engine, temperature=TEMPERATURE, advantages=ADVANTAGES, key=5)
    np.testing.assert_allclose(
        masked(trainer.logprobs(batch), batch),
        masked(batch.behaviour_logprobs, batch),
        atol=1e-5,
        rtol=0,
    )


def test_kl_reference_stays_fixed_while_the_policy_moves():
    engine, trainer = build(kl_coef=0.5)
    batch = rollout_batch(engine, temperature=TEMPERATURE, advantages=ADVANTAGES)
    reference = jax.tree.map(np.asarray, nnx.to_pure_dict(trainer.reference))
    initial = jax.tree.map(np.asarray, nnx.to_pure_dict(trainer.params))
    metrics = [trainer.train_step(batch) for _ in range(2)]
    jax.tree.map(np.testing.assert_array_equal, reference, nnx.to_pure_dict(trainer.reference))
    moved = jax.tree.leaves(
        jax.tree.map(
            lambda a, b: np.abs(a - np.asarray(b)).max(), initial, nnx.to_pure_dict(trainer.params)
        )
    )
    assert max(moved) > 1e-4
    assert metrics[0]["train/kl"] == pytest.approx(0.0, abs=1e-7)  # policy == reference
    assert metrics[1]["train/kl"] > 1e-6


def test_loss_slots_need_not_be_a_multiple_of_the_head_chunk():
    """E.g. `python run.py dataset.prompts_per_step=20 dataset.samples_per_prompt=6`: K = 960
    loss slots with 512-token head chunks."""
    model = tiny_model(seed=0)
    prompts = random_prompts([4] * 12, seed=1)
    completions = random_prompts([MAX_NEW] * 12, seed=2)
    batch = pack_sequences(
        prompts,
        completions,
        [np.zeros(MAX_NEW, np.float32)] * 12,
        np.ones(12, np.float32),
        row_tokens=32,
        loss_slots=96,
    )
    arrays = jax.tree.map(jnp.asarray, train_view(batch, normalizer=1.0))
    graphdef, params = nnx.split(model, nnx.Param)

    def logprobs_with(chunk):
        fn = lambda p, a: token_logprobs(nnx.merge(graphdef, p), a, temperature=1.0, chunk=chunk)
        return jax.jit(fn)(params, arrays)

    expected, logprobs = logprobs_with(96), logprobs_with(64)
    np.testing.assert_allclose(np.asarray(logprobs), np.asarray(expected), atol=1e-6)


def test_engine_keeps_published_weights_through_the_next_train_step(trained):
    engine, trainer, batch = trained["engine"], trained["trainer"], trained["batch"]
    engine.load_weights(trainer.params)
    published = rollout_batch(engine, temperature=TEMPERATURE, advantages=ADVANTAGES, key=5)
    trainer.train_step(batch)
    again = rollout_batch(engine, temperature=TEMPERATURE, advantages=ADVANTAGES, key=5)
    np.testing.assert_array_equal(again.tokens, published.tokens)
