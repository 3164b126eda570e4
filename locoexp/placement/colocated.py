"""`placement=co`: every host admits its own prompts, runs its own engine, trains FSDP-sharded.

One step is Algorithm 1 composed from `locoexp.placement.phases`; training stays synchronous and
on-policy. The loop around it handles warm-up, O2 (gc frozen after warm-up), periodic held-out
evaluation (its wall time kept out of the step clock) and metrics export (O1: the record of step
t goes to W&B in step t+1's log phase, off the step's critical path).
"""

import dataclasses
import gc
import time
from collections.abc import Callable

import jax
import numpy as np

from locoexp.algo.config import AdvantageKind
from locoexp.dataset.schedule import PromptSchedule
from locoexp.dataset.task import Task
from locoexp.metrics.timing import StepTimer
from locoexp.placement import phases
from locoexp.placement.config import OptConfig
from locoexp.rollout.engine import JaxEngine, SamplingParams
from locoexp.trainer.trainer import Trainer


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepSettings:
    """Plain values one step needs (built by main from the config groups)."""

    group_size: int
    max_new_tokens: int
    row_tokens: int
    sampling: SamplingParams
    eval_sampling: SamplingParams
    advantage: AdvantageKind
    advantage_eps: float
    opt: OptConfig
    host: int = 0
    hosts: int = 1
    seed: int = 0


@dataclasses.dataclass(kw_only=True)
class Colocated:
    task: Task
    schedule: PromptSchedule
    engine: JaxEngine
    trainer: Trainer
    settings: StepSettings
    timer: StepTimer = dataclasses.field(default_factory=StepTimer)

    def step(self, step: int) -> dict[str, float]:
        """One synchronous step; returns this host's metrics (timings added by the caller)."""
        s, timer = self.settings, self.timer
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(s.seed), step), s.host)
        with timer.phase("admission"):
            admitted = phases.admit(self.task, self.schedule, step, host=s.host, hosts=s.hosts,
                                    group_size=s.group_size, balance=s.opt.balance_prompts)
        with timer.phase("generation"):
            start = time.perf_counter()
            rollout = phases.generate(self.engine, admitted, key=key, max_new_tokens=s.max_new_tokens,
                                      sampling=s.sampling)
            generation_s = time.perf_counter() - start
        with timer.phase("reward"):
            scored = phases.score(self.task, admitted, rollout, advantage=s.advantage, eps=s.advantage_eps)
        with timer.phase("pack"):
            batch = phases.pack(admitted, rollout, scored, row_tokens=s.row_tokens,
                                rows_multiple=self.trainer.devices,
                                loss_slots=_loss_slots(len(admitted.requests), s.max_new_tokens))
        with timer.phase("train"):
            train_metrics = self.trainer.train_step(batch)
        with timer.phase("publish"):
            phases.publish(self.trainer.params, self.engine, one_call=s.opt.publish_in_one_call)
        return {
            **phases.rollout_metrics(admitted, rollout, scored),
            "rollout/decode_s_per_iteration": generation_s / max(rollout.decode_iterations, 1),
            "train/rows": batch.rows,
            **train_metrics,
        }

    def evaluate(self, *, limit: int | None) -> float:
        examples = self.task.eval[:limit] if limit else self.task.eval
        key = jax.random.fold_in(jax.random.key(self.settings.seed + 1), self.trainer.steps_done)
        return phases.evaluate(self.task, self.engine, examples, key=key,
                               max_new_tokens=self.settings.max_new_tokens,
                               sampling=self.settings.eval_sampling)


def _loss_slots(requests: int, max_new_tokens: int) -> int:
    """A fixed K for every step: every request may use its whole response cap."""
    return requests * max_new_tokens


def run_loop(runner: Colocated, *, steps: int, eval_every_steps: int, eval_limit: int | None,
             export: Callable[[dict], None], on_eval: Callable[[dict], None], start_time: float,
             warmup_steps: int = 1) -> dict[str, float]:
    """Run `steps` steps with periodic evaluation; returns the summary record."""
    eval_total_s, pending, records = 0.0, None, []
    for step in range(steps):
        if step == warmup_steps and runner.settings.opt.freeze_gc:
            gc.collect()
            gc.freeze()  # O2: everything allocated during warm-up is never scanned again
            gc.disable()
        with runner.timer.step():
            metrics = runner.step(step)
            with runner.timer.phase("log"):
                if pending is not None:
                    export(pending)
        record = {"step": step, **metrics, **runner.timer.metrics(),
                  "time/elapsed_s": time.perf_counter() - start_time - eval_total_s}
        record["timing/host_orchestration_share"] = _host_share(record)
        pending = record
        records.append(record)
        last = step == steps - 1
        if (eval_every_steps and (step + 1) % eval_every_steps == 0) or last:
            export(pending)
            pending = None
            eval_start = time.perf_counter()
            accuracy = runner.evaluate(limit=eval_limit)
            eval_s = time.perf_counter() - eval_start
            eval_total_s += eval_s
            on_eval({"step": step, "eval/accuracy": accuracy, "eval/seconds": eval_s,
                     "time/elapsed_s": record["time/elapsed_s"]})
    if pending is not None:
        export(pending)
    if runner.settings.opt.freeze_gc:
        gc.enable()
    return _summary(records)


def _host_share(record: dict) -> float:
    """Share of the step outside compiled device programs (Section 3.2's host orchestration),
    approximated by the phases that are pure host work plus the unaccounted remainder."""
    host = sum(record.get(f"timing/{p}_s", 0.0) for p in ("admission", "reward", "pack", "log"))
    return (host + record["timing/unaccounted_s"]) / record["timing/step_s"]


def _summary(records: list[dict]) -> dict[str, float]:
    first = records[: min(5, len(records))]
    last = records[-min(5, len(records)) :]
    return {
        "steps": len(records),
        "reward_first5": float(np.mean([r["rollout/reward_mean"] for r in first])),
        "reward_last5": float(np.mean([r["rollout/reward_mean"] for r in last])),
        "step_s_median": float(np.median([r["timing/step_s"] for r in records])),
    }
