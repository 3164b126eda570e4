"""The in-process transport: both halves of the step in this process, staleness 0.

`placement=co` (LoCoJAX-CO, Algorithm 1): one process per host; each admits its own prompts,
runs its own engine over its own devices, scores its own groups; all hosts then train one
FSDP-sharded step and load the updated weights into their engines.

`placement=single_controller` (the Pathways baseline's structure, Section 2): the same step run
by one process over every device: it admits all requests serially and its engine is one
lockstep program across all devices (`locoexp.layout`: one process holding every device).

Every host runs `loop.StepLoop` with this transport; what crosses hosts is `multihost.py`'s.
A run that survives reaches the trainer's state through `restore` and `checkpoint` (every host
its own shards; a restore also publishes the restored weights to this host's engine) and writes
the policy with `export` (`transport.Transport`).
"""

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from locoexp.checkpoint.progress import RunProgress
from locoexp.checkpoint.state import RunCheckpoints
from locoexp.metrics.breakdown import StepProfiler
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
from locoexp.tokenizer.protocol import Tokenizer


@dataclasses.dataclass(kw_only=True)
class InProcess:
    rollout: RolloutHalf
    trainer: TrainerHalf
    group: HostGroup  # this host among every host (each runs the loop)
    # the steps this host traces around its step (`profile_steps`; none unless the run says)
    profiler: StepProfiler = dataclasses.field(
        default_factory=lambda: StepProfiler(Path("."), frozenset())
    )

    def start_rollout(self, step: int, published: Published) -> RolloutBatch:
        return self.rollout.run(step, published)

    def collect_rollout(
        self, pending: RolloutBatch, timer: StepTimer | None
    ) -> tuple[list[HalfReport], list[RolloutBatch]]:
        return [pending.report], [pending]

    def start_train(
        self, step: int, batches: list[RolloutBatch], *, carried: dict[str, Any] | None
    ) -> TrainResult:
        return self.trainer.train(step, batches, carried=carried)

    def collect_train(self, pending: TrainResult, timer: StepTimer) -> list[TrainResult]:
        return [pending]

    def exchange(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        return exchange_metrics(self.group, record)

    def evaluate(self, published: Published, *, limit: int | None) -> float:
        """Held-out accuracy; each host scores an equal share of the examples."""
        correct, scored = self.rollout.evaluate(published, limit=limit)
        totals = self.group.allgather(np.array([correct, scored])).sum(axis=0)
        return float(totals[0] / max(totals[1], 1))

    def restore(self, checkpoints: RunCheckpoints, progress: RunProgress) -> Published:
        """Continue from the checkpoint after `progress.next_step` updates; the restored weights
        are published to this host's engine (what the next batch samples with)."""
        published = self.trainer.restore(checkpoints, progress.next_step)
        assert published is not None, "in-process, every trainer host publishes to its engine"
        return published

    def checkpoint(self, checkpoints: RunCheckpoints, progress: RunProgress, *, wait: bool) -> None:
        """This host's shards of the training state and (process 0) `progress`."""
        self.trainer.save(checkpoints, progress, wait=wait)

    def export(self, directory: Path, *, model: ModelConfig, tokenizer: Tokenizer) -> None:
        """The policy as a Hugging Face directory (every host calls; process 0 writes)."""
        self.trainer.export(directory, model=model, tokenizer=tokenizer)
