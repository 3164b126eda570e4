"""The Ray transport (`placement=da`, LoCoJAX-DA, Sections 2 and 4.4): the loop runs in a Ray
driver and the halves in actors (`ray_hosts.py`), with staleness 1.

Step t: wait for batch t (`timing/trainer_idle_s`), start training on it, start batch t+1 with
the newest published weights (those after step t-1), wait for training (`trainer_round_s`).
Batches travel as object-store references from rollout actors to trainer actors; the driver
fetches only their reports. Records have the `co` keys where they mean the same thing:
rollout-side timings (`load`, `admission`, `generation`, `reward`, `rollout`) are those of the
batch trained at that step, trainer-side ones (`transfer`, `pack`, `train`, `publish`,
`trainer`) of that step; `timing/step_s` is the driver's period. The driver checks that every
batch is trained exactly once with the scheduled prompts (`BatchLedger`, `batches.jsonl`).
Every actor and Ray itself stop when the run ends or fails.
"""

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import ray

from locoexp.dataset.schedule import PromptSchedule
from locoexp.metrics.timing import StepTimer
from locoexp.placement.halves import HalfReport, Published, TrainResult
from locoexp.placement.ray_hosts import DaLayout, Hosts, start_hosts, start_ray


class BatchLedger:
    """Each step's batch must be trained exactly once, with exactly the scheduled prompts."""

    def __init__(self, schedule: PromptSchedule, example_ids: list[int], path: Path):
        self.schedule, self.example_ids = schedule, example_ids
        self.trained: list[int] = []
        self._file = path.open("a", encoding="utf-8")

    def record(self, result: TrainResult) -> None:
        step, trained_ids = result.step, list(result.example_ids)
        scheduled = [self.example_ids[i] for i in self.schedule.batch(step)]
        if step in self.trained or sorted(trained_ids) != sorted(scheduled):
            raise RuntimeError(
                f"step {step}: trained prompts {sorted(trained_ids)} are not batch {step}'s "
                f"{sorted(scheduled)} exactly once (already trained: {step in self.trained})"
            )
        self.trained.append(step)
        line = {"step": step, "example_ids": trained_ids, "weight_versions": result.versions}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


@dataclasses.dataclass(kw_only=True)
class RayActors:
    hosts: Hosts
    ledger: BatchLedger

    def start_rollout(self, step: int, published: Published) -> list:
        """Batch `step` on every rollout host: [(report ref, batch ref)] per host."""
        return [
            r.generate.options(num_returns=2).remote(step, published) for r in self.hosts.rollouts
        ]

    def collect_rollout(self, pending: list, timer: StepTimer | None) -> tuple[list, list]:
        with timer.phase("trainer_idle") if timer else contextlib.nullcontext():
            reports: list[HalfReport] = ray.get([report for report, _ in pending])
        return reports, [batch for _, batch in pending]

    def start_train(self, step: int, batches: list, *, carried: dict | None) -> list:
        # carried is None: O1 is refused under da (Config._check_placement_keys)
        return [t.train.remote(step, batches) for t in self.hosts.trainers]

    def collect_train(self, pending: list, timer: StepTimer) -> list[TrainResult]:
        with timer.phase("trainer_round"):
            results = ray.get(pending)
        self.ledger.record(results[0])
        return results

    def exchange(self, record: dict) -> list[dict]:
        return [record]  # the driver already holds every host's report

    def evaluate(self, published: Published, *, limit: int | None) -> float:
        """Held-out accuracy of `published`, each rollout host scoring its share."""
        results = ray.get([r.evaluate.remote(published, limit=limit) for r in self.hosts.rollouts])
        correct, scored = np.sum(results, axis=0)
        return float(correct / max(scored, 1))


@contextlib.contextmanager
def ray_actors(
    layout: DaLayout,
    *,
    build_rollout: Callable[..., Any],
    build_trainer: Callable[..., Any],
    freeze_gc: bool,
    ledger: BatchLedger,
) -> Iterator[RayActors]:
    """Start Ray and one actor per host; stop every actor, Ray and the ledger afterwards."""
    hosts = Hosts()
    try:
        start_ray(layout)
        start_hosts(
            hosts,
            layout,
            build_rollout=build_rollout,
            build_trainer=build_trainer,
            freeze=freeze_gc,
        )
        yield RayActors(hosts=hosts, ledger=ledger)
    finally:
        ledger.close()
        try:
            hosts.stop()
        finally:
            ray.shutdown()
