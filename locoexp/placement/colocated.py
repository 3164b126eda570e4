"""`placement=co` (LoCoJAX-CO, Algorithm 1): every host admits its own prompts, runs its own
engine over its own devices, scores its own groups; all hosts then train one FSDP-sharded step
and load the updated weights into their engines. Synchronous and on-policy.

`placement=single_controller` is the same step run by one process over every device: it admits
all requests serially and its engine is one lockstep program across all devices (the Pathways
baseline's structure, Section 2), with the same trainer.

The loop handles warm-up, O2 (gc frozen after warm-up), held-out evaluation (its wall time kept
out of the step clock) and metrics: hosts exchange per-host metrics and process 0 exports them.
O1 (Table B1): step t's metrics ride on step t+1's row agreement instead of their own barrier.
"""

import dataclasses
import gc
import time
from collections.abc import Callable

import jax
import numpy as np

from locoexp.dataset.admission import AdmissionLog
from locoexp.dataset.schedule import PromptSchedule
from locoexp.dataset.task import Task
from locoexp.metrics.breakdown import StepProfiler
from locoexp.metrics.run_output import summarize_steps
from locoexp.metrics.timing import StepTimer, host_orchestration_s
from locoexp.placement import phases
from locoexp.placement.multihost import HostGroup, combine_host_metrics
from locoexp.placement.phases import StepSettings
from locoexp.rollout.engine import JaxEngine
from locoexp.trainer.trainer import Trainer


@dataclasses.dataclass(kw_only=True)
class Colocated:
    task: Task
    schedule: PromptSchedule
    engine: JaxEngine
    trainer: Trainer
    settings: StepSettings
    hosts: HostGroup
    timer: StepTimer = dataclasses.field(default_factory=StepTimer)
    admission_log: AdmissionLog | None = None  # this host's per-step admission records
    metric_keys: list[str] | None = None
    # O1: the previous step's metrics waiting to ride on this step's row agreement, and what
    # that agreement brought back from every host.
    carried_metrics: dict | None = None
    exchanged: list[dict] | None = None

    def step(self, step: int) -> dict[str, float]:
        """One synchronous step; returns this host's metrics (timings added by the caller)."""
        s, timer, host = self.settings, self.timer, self.hosts
        part = phases.run_rollout(
            self.task,
            self.schedule,
            self.engine,
            step,
            host=host.index,
            hosts=host.count,
            settings=s,
            timer=timer,
        )
        admitted, rollout, scored = part.admitted, part.rollout, part.scored
        if self.admission_log is not None:
            self.admission_log.write(step, admitted.record)
        with timer.phase("pack"):
            slots = _round_up(len(admitted.requests) * s.max_new_tokens, s.loss_slot_multiple)
            batch = phases.pack(
                admitted,
                rollout,
                scored,
                row_tokens=s.row_tokens,
                rows_multiple=self.trainer.local_devices,
                agree_rows=self._agree_rows,
                loss_slots=slots,
            )
        with timer.phase("train"):
            train_metrics = self.trainer.train_step(batch)
        with timer.phase("publish"):
            phases.publish(
                self.trainer.params,
                self.engine,
                mesh=self.trainer.mesh,
                one_call=s.opt.publish_in_one_call,
            )
        return {
            **part.metrics(),
            "train/rows": batch.rows,
            **train_metrics,
        }

    def _agree_rows(self, rows: int) -> int:
        """The packed-shape exchange; with O1 it also carries the previous step's metrics."""
        carried = self.carried_metrics
        payload = np.array([rows, *([] if carried is None else self._vector(carried))], np.float64)
        gathered = self.hosts.allgather(payload)
        if carried is not None:
            self.carried_metrics = None
            self.exchanged = [self._record(row[1:]) for row in gathered]
        return int(gathered[:, 0].max())

    def exchange_metrics(self, host_metrics: dict[str, float]) -> list[dict]:
        """One step's per-host metrics -> every host's (a collective of its own)."""
        return [self._record(row) for row in self.hosts.allgather(self._vector(host_metrics))]

    def _vector(self, metrics: dict[str, float]) -> np.ndarray:
        self.metric_keys = sorted(metrics)  # every host has the same keys in a step
        return np.array([metrics[k] for k in self.metric_keys], np.float64)

    def _record(self, row: np.ndarray) -> dict[str, float]:
        return dict(zip(self.metric_keys, row.tolist(), strict=True))

    def evaluate(self, *, limit: int | None) -> float:
        """Held-out accuracy; each host scores an equal share of the examples."""
        examples = self.task.eval[:limit] if limit else self.task.eval
        mine = examples[self.hosts.index :: self.hosts.count]
        key = jax.random.fold_in(jax.random.key(self.settings.seed + 1), self.trainer.steps_done)
        correct, scored = phases.evaluate(
            self.task,
            self.engine,
            mine,
            key=jax.random.fold_in(key, self.hosts.index),
            max_new_tokens=self.settings.max_new_tokens,
            sampling=self.settings.eval_sampling,
        )
        totals = self.hosts.allgather(np.array([correct, scored])).sum(axis=0)
        return float(totals[0] / max(totals[1], 1))


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclasses.dataclass(kw_only=True)
class LoopHooks:
    """Where finished records go (process 0 only) and how evaluations are reported."""

    export: Callable[[dict], None]
    on_eval: Callable[[dict], None]


def run_loop(
    runner: Colocated,
    *,
    profiler: StepProfiler,
    steps: int,
    eval_every_steps: int,
    eval_at_updates: list[int],
    eval_limit: int | None,
    hooks: LoopHooks,
    start_time: float,
    warmup_steps: int = 1,
) -> dict[str, float]:
    """Run `steps` steps with periodic evaluation; returns the summary (on every host).

    Step t's metrics, timings included, cross hosts during step t+1 (in its log phase, or with
    O1 on its row agreement) and process 0 exports them then; the last step's are flushed."""
    eval_total_s, records, previous = 0.0, [], None
    o1 = runner.settings.opt.metrics_off_barrier

    def emit(per_host: list[dict] | None) -> None:
        if not per_host:
            return
        record = combine_host_metrics(per_host)
        record["step"] = int(record["step"])
        record["timing/host_orchestration_s"] = host_orchestration_s(record)
        record["timing/host_orchestration_share"] = (
            record["timing/host_orchestration_s"] / record["timing/step_s"]
        )
        records.append(record)
        if runner.hosts.is_leader:
            hooks.export(record)

    try:
        for step in range(steps):
            if step == warmup_steps and runner.settings.opt.freeze_gc:
                gc.collect()
                gc.freeze()  # O2: what warm-up allocated is never scanned again
                gc.disable()
            with profiler.capture(step):
                with runner.timer.step():
                    runner.carried_metrics = previous if o1 else None
                    metrics = runner.step(step)
                    with runner.timer.phase("log"):
                        if o1:
                            emit(runner.exchanged)
                        elif previous is not None:
                            emit(runner.exchange_metrics(previous))
                        runner.exchanged = None
                step_end = time.perf_counter()
            breakdown = profiler.metrics(step)
            if breakdown:  # the profiler's stop and parse stay off the clock, like evaluation
                eval_total_s += time.perf_counter() - step_end
            previous = {"step": step, **metrics, **runner.timer.metrics(), **breakdown}
            previous["time/elapsed_s"] = time.perf_counter() - start_time - eval_total_s
            updates = step + 1
            if (
                (eval_every_steps and updates % eval_every_steps == 0)
                or updates in eval_at_updates
                or updates == steps
            ):
                emit(runner.exchange_metrics(previous))
                previous = None
                eval_start = time.perf_counter()
                accuracy = runner.evaluate(limit=eval_limit)
                eval_s = time.perf_counter() - eval_start
                eval_total_s += eval_s
                if runner.hosts.is_leader:
                    hooks.on_eval(
                        {
                            "step": step,
                            "eval/accuracy": accuracy,
                            "eval/seconds": eval_s,
                            "time/elapsed_s": eval_start - start_time - (eval_total_s - eval_s),
                        }
                    )
    finally:
        if runner.settings.opt.freeze_gc:
            gc.enable()
            gc.unfreeze()
    return summarize_steps(records)
