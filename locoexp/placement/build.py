"""Builders of the two halves of a step from a `settings.HalvesSpec`, for every placement:
in this process (`co`, `single_controller`: `open_in_process`), or, from the same
`build_rollout_half` and `build_trainer_half`, in a Ray actor (`da`: `placement.ray.hosts`).

Placement composes the trainer and the rollout engine here; neither of them imports placement.
This module builds and never decides when anything runs (`loop.py` and `locoexp.session` do).
"""

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path

import jax

from locoexp.dataset.build import build_task
from locoexp.dataset.config import DatasetConfig
from locoexp.dataset.schedule import PromptSchedule
from locoexp.dataset.task import Task
from locoexp.errors import require
from locoexp.metrics.breakdown import StepProfiler
from locoexp.model.checkpoint import load_model
from locoexp.model.config import ModelConfig
from locoexp.placement.admission import AdmissionLog
from locoexp.placement.halves import RolloutHalf, TrainerHalf, publish_to_engine
from locoexp.placement.inprocess import InProcess
from locoexp.placement.multihost import HostGroup
from locoexp.placement.settings import HalvesSpec
from locoexp.rollout.build import build_engine
from locoexp.rollout.engine import JaxEngine
from locoexp.trainer.trainer import Trainer, trainer_mesh


def build_checked_task(model: ModelConfig, dataset: DatasetConfig) -> Task:
    """The run's task, refused when the model's vocabulary does not cover its tokenizer."""
    task = build_task(dataset, tokenizer_dir=model.checkpoint, vocab_size=model.vocab_size)
    require(
        task.tokenizer.vocab_size <= model.vocab_size,
        f"model.vocab_size={model.vocab_size} is smaller than the tokenizer's "
        f"{task.tokenizer.vocab_size} tokens of dataset={dataset.kind.value}; pick a model "
        "whose vocabulary covers it (e.g. model=tiny_qwen).",
    )
    return task


@contextlib.contextmanager
def open_in_process(
    halves: HalvesSpec,
    *,
    task: Task,
    schedule: PromptSchedule,
    timer,
    run_dir: Path,
    profile_steps: frozenset[int],
) -> Iterator[InProcess]:
    """This process's transport (`co`, `single_controller`), its rollout host writing its
    admission records under `run_dir` (`admission/host<h>.jsonl`) and tracing `profile_steps`
    (`profile/step<t>/host<h>/`)."""
    transport = build_in_process(halves, task, schedule, HostGroup.current(), timer)
    index = transport.group.index
    transport.rollout.admission_log = AdmissionLog(run_dir / "admission" / f"host{index}.jsonl")
    transport.profiler = StepProfiler(run_dir, profile_steps, index=index)
    yield transport


def build_in_process(
    halves: HalvesSpec, task: Task, schedule: PromptSchedule, group: HostGroup, timer
) -> InProcess:
    """`co` and `single_controller`: one policy for the engine on this process's devices (every
    device of the single controller) and the trainer on every device; one shared `timer`."""
    policy = load_model(halves.model, seed=halves.settings.seed)
    where = dict(settings=halves.settings, timer=timer)
    rollout = build_rollout_half(
        policy, task, halves, schedule=schedule, host=group.index, hosts=group.count, **where
    )
    one_call = halves.settings.opt.publish_in_one_call
    publish = functools.partial(publish_to_engine, engine=rollout.engine, one_call=one_call)
    # Table H2's 405B workaround (rollout=jax only: RolloutConfig refuses it with vLLM)
    releases = halves.rollout.release_weights_during_training
    release = None
    if releases:  # RolloutConfig allows it with the JAX engine only
        assert isinstance(rollout.engine, JaxEngine)
        release = rollout.engine.release_weights
    trainer = build_trainer_half(
        policy, halves, group=group, publish=publish, release=release, **where
    )
    return InProcess(rollout=rollout, trainer=trainer, group=group)


def build_rollout_half(policy, task: Task, halves: HalvesSpec, *, load=None, **half) -> RolloutHalf:
    """A host's rollout half: its engine over this process's devices, from `policy`'s weights."""
    d = halves.dataset
    engine = build_engine(
        policy,
        halves.rollout,
        eos_id=task.tokenizer.eos_id,
        pad_id=task.tokenizer.pad_id,
        devices=jax.local_devices(),
        max_sequence_tokens=d.max_prompt_tokens + d.max_new_tokens,
    )
    return RolloutHalf(task=task, engine=engine, load=load, **half)


def build_trainer_half(policy, halves: HalvesSpec, **half) -> TrainerHalf:
    """The trainer half over every device of this process's `jax.distributed` group."""
    s, mesh = halves.settings, trainer_mesh(jax.devices(), halves.trainer.expert_parallel)
    trainer = Trainer(
        policy,
        halves.algo,
        halves.trainer,
        mesh=mesh,
        temperature=s.sampling.temperature,
        max_new_tokens=s.max_new_tokens,
        adapter=halves.adapter,
    )
    return TrainerHalf(trainer=trainer, **half)
