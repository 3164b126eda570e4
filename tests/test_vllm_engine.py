"""`rollout=vllm` end to end: GRPO steps with vLLM generating, the JAX trainer training.

Needs vLLM (skipped with a reason where it is absent, as in the default environment). Run it in
the vLLM virtualenv of README.md ("vLLM backend"):

    /opt/vllm-venv/bin/python -m pytest -m vllm tests/test_vllm_engine.py

One engine start (eager, 0.25 GiB KV cache) for the whole module: vLLM-CPU starts slowly.
"""

import dataclasses
import importlib.util
import os

import jax
import numpy as np
import pytest

from locoexp.algo.config import AdvantageKind, AlgoConfig
from locoexp.algo.grpo import compute_group_advantages
from locoexp.dataset.build import build_task
from locoexp.dataset.config import DatasetConfig, DatasetKind, SyntheticTaskConfig
from locoexp.dataset.task import Task
from locoexp.model.config import ModelConfig
from locoexp.model.transformer import build_model
from locoexp.rollout.build import build_engine
from locoexp.rollout.config import EngineKind, RolloutConfig, SamplingParams
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.packing import pack_sequences
from locoexp.trainer.trainer import Trainer

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed (see 'vLLM backend' in README.md for its virtualenv)",
    ),
]

# fp32 on both sides; vLLM-CPU (oneDNN GEMMs, its own attention kernel) and XLA sum in different
# orders, which moves a log-prob by ~1e-6 here. 1e-4 is far below what one update moves it.
TOLERANCE = 1e-4
PROMPTS, GROUP, MAX_NEW, STEPS = 2, 4, 8, 3


@dataclasses.dataclass
class Run:
    task: Task
    engine: object
    trainer: Trainer
    initial: object  # the trainer's parameters before the first step, on the host


@pytest.fixture(scope="module")
def run():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM-CPU attention supports head sizes 32, 64, ...: the tiny model with head_dim 32.
    model = build_model(ModelConfig(head_dim=32), seed=0)
    task = build_task(
        DatasetConfig(
            kind=DatasetKind.synthetic,
            synthetic=SyntheticTaskConfig(num_digits=3, train_size=512, held_out_size=8),
        )
    )
    rollout = RolloutConfig(engine=EngineKind.vllm, kv_cache_gib=0.25, enforce_eager=True)
    tokenizer = task.tokenizer
    engine = build_engine(
        model,
        rollout,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        devices=jax.local_devices(),
        max_sequence_tokens=32,
    )
    trainer = Trainer(
        model,
        AlgoConfig(learning_rate=3e-3),
        TrainerConfig(),
        mesh=jax.sharding.Mesh(np.array(jax.devices()), ("fsdp",)),
        temperature=rollout.temperature,
        max_new_tokens=MAX_NEW,
    )
    return Run(task, engine, trainer, jax.tree.map(np.asarray, trainer.params))


def _rollout_batch(run: Run, step: int):
    """Algorithm 1 lines 1-4 on one host: admit, generate with vLLM, reward, pack."""
    examples = run.task.train[step * PROMPTS : (step + 1) * PROMPTS]
    prompts = [e.prompt_tokens for e in examples for _ in range(GROUP)]
    rollout = run.engine.generate(
        prompts,
        key=jax.random.key(step),
        max_new_tokens=MAX_NEW,
        sampling=SamplingParams(temperature=1.0),
    )
    completions = [rollout.completion(n) for n in range(len(prompts))]
    rewards = run.task.score([e for e in examples for _ in range(GROUP)], completions)
    advantages = compute_group_advantages(rewards.reshape(PROMPTS, GROUP), AdvantageKind.grpo, 1e-6)
    logprobs = [rollout.logprobs[n, : rollout.lengths[n]] for n in range(len(prompts))]
    return pack_sequences(
        prompts,
        completions,
        logprobs,
        advantages.reshape(-1),
        row_tokens=32,
        loss_slots=len(prompts) * MAX_NEW,
    )


def _largest_error(run: Run, batch, params=None) -> float:
    """Largest |engine log-prob - trainer recomputation| over the batch's completion tokens."""
    if params is None:
        recomputed = run.trainer.logprobs(batch)
    else:
        recomputed = np.asarray(run.trainer._logprobs(params, run.trainer.device_batch(batch)))
    live = batch.loss_mask > 0
    return float(np.abs(recomputed - batch.behaviour_logprobs)[live].max())


def test_engine_logprobs_match_the_trainer_after_every_publication(run):
    for step in range(STEPS):
        batch = _rollout_batch(run, step)
        assert _largest_error(run, batch) < TOLERANCE, f"step {step}: before the update"
        metrics = run.trainer.train_step(batch)  # line 5: one GRPO update
        assert np.isfinite(metrics["train/loss"])
        run.engine.load_weights(run.trainer.params)  # line 6: publication in one call
        fresh = _rollout_batch(run, 100 + step)
        error = _largest_error(run, fresh)
        assert error < TOLERANCE, f"step {step}: engine vs trainer log-probs differ by {error}"
        # The same tokens under the initial weights are far off: the engine runs the new ones.
        moved = _largest_error(run, fresh, run.initial)
        assert moved > 100 * TOLERANCE, f"step {step}: the initial weights are only {moved} off"


def test_per_layer_publication_matches_the_trainer(run):
    run.trainer.train_step(_rollout_batch(run, 200))  # the weights move again
    run.engine.load_weights_per_layer(run.trainer.params)
    assert _largest_error(run, _rollout_batch(run, 201)) < TOLERANCE


def test_rollout_follows_the_engine_interface(run):
    prompts = [example.prompt_tokens for example in run.task.train[:3]]
    key = jax.random.key(7)
    forced = run.engine.generate(
        prompts,
        key=key,
        max_new_tokens=MAX_NEW,
        sampling=SamplingParams(temperature=1.0, ignore_eos=True),
    )
    assert forced.tokens.shape == (3, MAX_NEW) and forced.tokens.dtype == np.int32
    assert (forced.lengths == MAX_NEW).all() and forced.truncated.all()
    again = run.engine.generate(
        prompts,
        key=key,
        max_new_tokens=MAX_NEW,
        sampling=SamplingParams(temperature=1.0, ignore_eos=True),
    )
    np.testing.assert_array_equal(forced.tokens, again.tokens)  # the key decides the sample
    free = run.engine.generate(
        prompts * 8, key=key, max_new_tokens=MAX_NEW, sampling=SamplingParams(temperature=1.0)
    )
    eos = run.task.tokenizer.eos_id
    for n in range(len(free.lengths)):
        length = free.lengths[n]
        ended = free.tokens[n, length - 1] == eos
        assert ended or length == MAX_NEW
        assert free.truncated[n] == (not ended)
        assert (free.tokens[n, length:] == run.task.tokenizer.pad_id).all()
        assert (free.logprobs[n, length:] == 0).all() and (free.logprobs[n, :length] < 0).all()
