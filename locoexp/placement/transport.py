"""`Transport`: where the two halves of a step run and how batches, results and the training
state travel between them. Every placement's transport satisfies it, and the loop
(`loop.StepLoop`) and the run session (`locoexp.session`) hold only this Protocol.

- `InProcess` (`inprocess.py`): both halves in this process; every host runs the loop (`co`,
  `single_controller`).
- `RayActors` (`ray/transport.py`): the halves in Ray actors; the driver alone runs the loop
  (`da`).

The step's calls: `start_*` hand work over, `collect_*` wait for it (idempotent) and time their
wait on the loop's timer where the work runs elsewhere. The state's calls (`restore`,
`checkpoint`, `export`) are made by the run session at the steps the loop says; each transport
reaches the trainer's arrays where they live (this process, or every trainer actor).
"""

from pathlib import Path
from typing import Any, Protocol, TypeVar

from locoexp.checkpoint.progress import RunProgress
from locoexp.checkpoint.state import RunCheckpoints
from locoexp.metrics.breakdown import StepProfiler
from locoexp.metrics.timing import StepTimer
from locoexp.model.config import ModelConfig
from locoexp.placement.halves import HalfReport, Published, TrainResult
from locoexp.placement.multihost import HostGroup
from locoexp.tokenizer.protocol import Tokenizer

PendingRollout = TypeVar("PendingRollout")  # a batch in flight (a RolloutBatch in-process)
Batches = TypeVar("Batches")  # what the trainer half is handed (batches, or their Ray refs)
PendingTrain = TypeVar("PendingTrain")  # a train step in flight


class Transport(Protocol[PendingRollout, Batches, PendingTrain]):
    @property
    def group(self) -> HostGroup:
        """The processes that run the loop with this transport (every host in-process; the
        driver alone under `da`): they agree on stops and on the resumed clock."""
        ...

    @property
    def profiler(self) -> StepProfiler:
        """What this process traces of the profiled steps (`profile_steps`): every host its own
        step in-process; nothing on the Ray driver, whose actors trace their own sides."""
        ...

    def start_rollout(self, step: int, published: Published) -> PendingRollout: ...

    def collect_rollout(
        self, pending: PendingRollout, timer: StepTimer | None
    ) -> tuple[list[HalfReport], Batches]: ...

    def start_train(
        self, step: int, batches: Batches, *, carried: dict[str, Any] | None
    ) -> PendingTrain: ...

    def collect_train(self, pending: PendingTrain, timer: StepTimer) -> list[TrainResult]: ...

    def exchange(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """Every host's record of step `record["step"]` (in-process: a collective), with what
        this transport alone measures (the Ray transport: Eq. 4's A, the overlap of the step's
        training with the next batch's rollout, its restarts)."""
        ...

    def evaluate(self, published: Published, *, limit: int | None) -> float: ...

    def restore(self, checkpoints: RunCheckpoints, progress: RunProgress) -> Published:
        """Continue from the checkpoint after `progress.next_step` updates: the trainer's
        arrays restored and published; returns the weights the next batch samples with."""
        ...

    def checkpoint(self, checkpoints: RunCheckpoints, progress: RunProgress, *, wait: bool) -> None:
        """The training state after `progress.next_step` updates, with `progress`."""
        ...

    def export(self, directory: Path, *, model: ModelConfig, tokenizer: Tokenizer) -> None:
        """The policy as a Hugging Face directory."""
        ...
