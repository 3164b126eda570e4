"""`rollout.release_weights_during_training` (Table H2's 405B workaround): the colocated engine
drops its weight copy for the train phase and the publication after it loads fresh ones; the
step computes exactly what it computes with the key off. Refused where it cannot act."""

import jax
import numpy as np
import pytest

from locoexp.compose import compose_config
from locoexp.dataset.schedule import build_schedule
from locoexp.errors import ConfigError
from locoexp.metrics.timing import StepTimer
from locoexp.placement.build import build_checked_task, build_in_process
from locoexp.placement.halves import Published
from locoexp.placement.multihost import HostGroup
from locoexp.session.build import build_spec

TINY_STEP = [
    "logger=none",
    "eval_every_steps=0",
    "steps=2",
    "dataset.prompts_per_step=2",
    "dataset.samples_per_prompt=2",
    "dataset.synthetic.held_out_size=2",
]


def run_steps(*overrides: str, steps: int = 2):
    """`steps` in-process co steps; returns losses, the trainer's and the engine's final
    params and, per train phase, whether the engine held weights when the update began."""
    spec = build_spec(compose_config([*TINY_STEP, *overrides]))
    halves = spec.halves
    task = build_checked_task(halves.model, halves.dataset)
    schedule = build_schedule(halves.dataset, steps=spec.loop.steps, num_examples=len(task.train))
    timer = StepTimer()
    step_of = build_in_process(halves, task, schedule, HostGroup(index=0, count=1), timer)
    engine, trainer = step_of.rollout.engine, step_of.trainer.trainer
    held, train_step = [], trainer.train_step

    def spy(packed):
        held.append(engine.holds_weights)
        return train_step(packed)

    trainer.train_step = spy
    published, losses = Published(0), []
    for step in range(steps):
        with timer.step():
            batch = step_of.start_rollout(step, published)
            result = step_of.start_train(step, [batch], carried=None)
        published = result.published
        losses.append(float(result.report.metrics["train/loss"]))
    pull = lambda tree: [np.asarray(x) for x in jax.tree.leaves(tree)]
    return losses, pull(trainer.params), pull(engine.params), held


@pytest.mark.parametrize("one_call", ["true", "false"])
@pytest.mark.slow
def test_released_weights_change_nothing_the_step_computes(one_call):
    publish = f"opt.publish_in_one_call={one_call}"
    kept = run_steps(publish)
    freed = run_steps(publish, "rollout.release_weights_during_training=true")
    assert kept[3] == [True, True] and freed[3] == [False, False]
    assert freed[0] == kept[0]
    for got, want in zip(freed[1] + freed[2], kept[1] + kept[2], strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_key_is_refused_where_the_engine_never_shares_the_trainers_devices():
    with pytest.raises(
        ConfigError, match=r"training=true is not read by this run \(rollout=jax, placement=da"
    ):
        compose_config(
            [
                "placement=da",
                "split=0.5",
                "hardware.hosts=2",
                "rollout.release_weights_during_training=true",
            ]
        )
    with pytest.raises(
        ConfigError,
        match=r"not read by this run \(rollout=vllm, .*: it applies only to rollout=jax",
    ):
        compose_config(["rollout=vllm", "rollout.release_weights_during_training=true"])
