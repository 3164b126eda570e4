"""The in-process transport: both halves of the step in this process, staleness 0.

`placement=co` (LoCoJAX-CO, Algorithm 1): one process per host; each admits its own prompts,
runs its own engine over its own devices, scores its own groups; all hosts then train one
FSDP-sharded step and load the updated weights into their engines.

`placement=single_controller` (the Pathways baseline's structure, Section 2): the same step run
by one process over every device: it admits all requests serially and its engine is one
lockstep program across all devices (`layout.py`: one process holding every device).

Every host runs `loop.StepLoop` with this transport; what crosses hosts is `multihost.py`'s.
A run that survives reaches the trainer's state through `state`/`load_state` (a restore also
publishes the restored weights to this host's engine) and writes the policy with `export`.
"""

import dataclasses
from pathlib import Path

import numpy as np

from locoexp.checkpoint.export import export_trainer_policy
from locoexp.checkpoint.state import RunCheckpoints, RunProgress
from locoexp.metrics.timing import StepTimer
from locoexp.model.config import ModelConfig
from locoexp.placement.halves import (
    HalfReport,
    Published,
    RolloutBatch,
    RolloutHalf,
    TrainerHalf,
    TrainResult,
)
from locoexp.placement.multihost import HostGroup, exchange_metrics


@dataclasses.dataclass(kw_only=True)
class InProcess:
    rollout: RolloutHalf
    trainer: TrainerHalf
    hosts: HostGroup

    def start_rollout(self, step: int, published: Published) -> RolloutBatch:
        return self.rollout.run(step, published)

    def collect_rollout(
        self, pending: RolloutBatch, timer: StepTimer | None
    ) -> tuple[list[HalfReport], list[RolloutBatch]]:
        return [pending.report], [pending]

    def start_train(
        self, step: int, batches: list[RolloutBatch], *, carried: dict | None
    ) -> TrainResult:
        return self.trainer.train(step, batches, carried=carried)

    def collect_train(self, pending: TrainResult, timer: StepTimer) -> list[TrainResult]:
        return [pending]

    def exchange(self, record: dict) -> list[dict]:
        return exchange_metrics(self.hosts, record)

    def evaluate(self, published: Published, *, limit: int | None) -> float:
        """Held-out accuracy; each host scores an equal share of the examples."""
        correct, scored = self.rollout.evaluate(published, limit=limit)
        totals = self.hosts.allgather(np.array([correct, scored])).sum(axis=0)
        return float(totals[0] / max(totals[1], 1))

    def state(self) -> dict:
        """The trainer's arrays a training-state checkpoint holds (`Trainer.state`)."""
        return self.trainer.trainer.state()

    def checkpoint(self, checkpoints: RunCheckpoints, progress: RunProgress, *, wait: bool):
        """This host's shards of `state()` and (process 0) `progress`, after its step."""
        checkpoints.save(progress, self.state(), wait=wait)

    def load_state(self, state: dict, *, steps_done: int) -> Published:
        """Continue from a restored `state()` after `steps_done` updates, and publish those
        weights to this host's engine (what the next batch samples with)."""
        self.trainer.trainer.load_state(state, steps_done=steps_done)
        return self.trainer.publish(self.trainer.trainer)

    def export(self, directory: Path, *, model: ModelConfig, tokenizer) -> Path | None:
        """The policy as a Hugging Face directory (every host calls; process 0 writes)."""
        trainer = self.trainer.trainer
        return export_trainer_policy(trainer, model, tokenizer, directory)
