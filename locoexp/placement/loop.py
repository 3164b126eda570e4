"""The one step loop of every placement.

Design note.
- Halves (`halves.py`): a step is a rollout half (load, admission, generation, reward -> a frozen
  `RolloutBatch`) and a trainer half (pack, train, publish -> a `TrainResult` with a typed
  `Published(version)`). Algorithm 1's phases inside them are `phases.py`'s functions.
- Transports carry batches and results between the halves: `InProcess` (`inprocess.py`): both
  halves in this process and every host runs this loop (`co`: one process per host, its own
  share; `single_controller`: one process over every device); `RayActors` (`ray/transport.py`):
  Ray actors wrap the same halves and only the driver runs this loop (`da`).
- Staleness s (`placement.max_staleness` under `da`, the paper's 1): batch t is sampled with the
  weights of an update >= t-s; before step t trains, every batch through t+s is started with the
  newest weights (those after update t). s=0 (`co`, `single_controller`): batch t starts after
  update t-1 is published, on-policy. s=1 (`da`): batch t+1 is handed to the rollout hosts before
  batch t is collected, each host starting its share once its share of t is done (no host waits
  for another: the straggler wait that staleness absorbs, Eq. 4's A); the loss importance-weights
  it by its behaviour log-probs (`algo.tis_cap`).
- Where the levers act (Table B1): O1 in the trainer half's row exchange (`multihost.exchange_rows`
  carries step t's per-host record instead of a collective of its own; refused under `da`, whose
  hosts report to the driver); O2 here (gc frozen after warm-up) and in every Ray actor; O3 in
  admission (`phases.split_across_hosts`); O4 in publication (`multihost.gather_for_engine`) and,
  under `da`, in the rollout host's weight load. `locoexp.applies` is the one place
  that says which placement honours which key.

The loop owns the schedule and the bookkeeping shared by every placement: the evaluation
schedule, the delayed emission of step t's record (it crosses hosts, during step t+1), every
placement's straggler (`timing/straggler_s`), evaluation wall time kept off the clock, the summary
and cost-to-learn. It never decides what a phase does, how data moves, or what a run writes
(`metrics.run_output` does). What only a transport measures, it adds in its `exchange`: the Ray
transport, Eq. 4's A and the overlap of step t's training with batch t+1's rollout
(`ray/terms.py`).

Runs that survive (every placement): a resumed run starts at `LoopPlan.start_step` with its
clock at the restored elapsed time (`clock_offset_s`, App. I.1); under `da` its first batches
are those in flight at the checkpoint, which it saved (the transport hands them over). After
step t (and its evaluation), every host (the driver under `da`) asks the hooks whether a stop
signal arrived (agreed across hosts) or a checkpoint is due; either flushes step t's record
first, then the hooks checkpoint updates t+1, and a stop raises `RunStopped`. What is saved and
where is `locoexp.checkpoint`'s and the transport's; the loop only says when. A lost `da` rollout
host is the transport's to replace; the loop never sees it (only `da/rollout_restarts` in the
records).
"""

import dataclasses
import gc
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from locoexp.checkpoint.stop import RunStopped
from locoexp.metrics.breakdown import StepProfiler
from locoexp.metrics.cost import Checkpoint
from locoexp.metrics.run_output import RunOutput, summarize_steps
from locoexp.metrics.steady import WARMUP_STEPS, SteadyWindow, steady_records
from locoexp.metrics.timing import StepTimer, host_orchestration_s
from locoexp.placement.halves import Published
from locoexp.placement.multihost import combine_host_metrics
from locoexp.placement.settings import LoopPlan
from locoexp.placement.transport import Transport
from locoexp.trainer.divergence import require_finite_step

NOTHING_PUBLISHED = Published(0)  # the initial weights, before any update


class RecordSink(Protocol):
    """Where records go: `metrics.run_output.RunOutput` (or a benchmark's list)."""

    def export(self, record: dict[str, Any]) -> None: ...

    def on_eval(self, checkpoint: Checkpoint, *, seconds: float) -> None: ...


class SurvivalHooks(Protocol):
    """Stops and checkpoints, called on every host after each step (`locoexp.session`'s)."""

    def stop_requested(self, step: int) -> int | None: ...  # the agreed signal number

    def saves_after(self, updates: int) -> bool: ...

    def checkpoint(self, updates: int, clock: "LoopClock", *, stopping: bool) -> None: ...

    def last_checkpoint(self) -> str | None: ...  # where the newest saved one is, for messages


@dataclasses.dataclass(kw_only=True)
class LoopClock:
    """Appendix I.1's clock: wall time since job start, evaluation excluded. A resumed run starts
    it at `offset_s` (`metrics.cost.resumed_elapsed_s`); `eval_total_s` is this attempt's."""

    start_time: float
    offset_s: float = 0.0
    eval_total_s: float = 0.0

    def elapsed_s(self, now: float | None = None) -> float:
        now = time.perf_counter() if now is None else now
        return self.offset_s + now - self.start_time - self.eval_total_s


def drive(
    transport: Transport[Any, Any, Any],
    plan: LoopPlan,
    *,
    timer: StepTimer,
    output: RunOutput | None,
    start_time: float,
    clock_offset_s: float = 0.0,
    hooks: SurvivalHooks | None = None,
    extra_summary: dict[str, Any] | None = None,
    earlier_eval_s: float = 0.0,
    published: Published = NOTHING_PUBLISHED,
    profiler: StepProfiler | None = None,
) -> dict[str, Any]:
    """Run the loop; the leader's `output` gets every record and `summary.json` (with
    cost-to-learn); returns the summary (on every host). The caller closes `output`.
    `earlier_eval_s`: evaluation seconds of a resumed run's earlier attempts (for `wall_s`);
    `published`: the weights the first batch samples with (a resumed run's restored ones);
    `profiler`: the steps this process traces (`profile_steps`)."""
    loop = StepLoop(
        transport,
        plan,
        timer=timer,
        output=output,
        start_time=start_time,
        clock_offset_s=clock_offset_s,
        hooks=hooks,
        published=published,
    )
    loop.profiler = profiler or loop.profiler
    records = loop.run()
    summary = {**summarize(records, plan.steady, staleness=plan.staleness), **(extra_summary or {})}
    if output is None:
        return summary
    clock = loop.clock
    return output.finish(
        summary,
        target=plan.eval_target,
        chips=plan.chips,
        chip_hour_price_usd=plan.chip_hour_price_usd,
        steady=plan.steady,
        wall_s=clock.elapsed_s() + clock.eval_total_s + earlier_eval_s,
    )


class StepLoop:
    """Steps, evaluations and records of one run (see the design note above)."""

    def __init__(
        self,
        transport: Transport[Any, Any, Any],
        plan: LoopPlan,
        *,
        timer: StepTimer,
        output: RecordSink | None,
        start_time: float,
        clock_offset_s: float = 0.0,
        hooks: SurvivalHooks | None = None,
        published: Published = NOTHING_PUBLISHED,
    ):
        self.transport, self.plan, self.timer = transport, plan, timer
        self.output, self.hooks = output, hooks
        self.clock = LoopClock(start_time=start_time, offset_s=clock_offset_s)
        self.records: list[dict[str, Any]] = []
        self.published = published
        self.pending: dict[int, Any] = {}  # batches started and not yet trained, by step
        self.started = plan.start_step - 1  # the newest batch started
        self.previous: dict[str, Any] | None = None  # step t's record, awaiting emission
        self.profiler = StepProfiler(Path("."), frozenset())  # profiles nothing

    def run(self) -> list[dict[str, Any]]:
        try:
            first = self.plan.start_step
            for step in range(first, self.plan.steps):
                if step == first + WARMUP_STEPS and self.plan.freeze_gc:
                    freeze_gc()
                self._step(step)
                if self.plan.evaluates_after(step + 1):
                    self._emit(None)
                    self._evaluate(step)
                self._survive(step)
            self._emit(None)
        finally:
            if self.plan.freeze_gc:
                unfreeze_gc()
        return self.records

    def _step(self, step: int) -> None:
        t, timer = self.transport, self.timer
        with self.profiler.capture(step):
            with timer.step():
                self._start_rollouts(step)
                reports, batches = t.collect_rollout(self.pending.pop(step), timer)
                carried = self.previous if self.plan.metrics_off_barrier else None
                training = t.start_train(step, batches, carried=carried)
                results = t.collect_train(training, timer)
                with timer.phase("log"):
                    self._emit(results[0].exchanged)
                # after step t-1's record is out; every host sees the same (global) loss
                saved = self.hooks.last_checkpoint() if self.hooks else None
                require_finite_step(results[0].report.metrics, step=step, last_checkpoint=saved)
            step_end = time.perf_counter()
        breakdown = self.profiler.metrics(step)
        if breakdown:  # the profiler's stop and parse stay off the clock, like evaluation
            self.clock.eval_total_s += time.perf_counter() - step_end
        published = results[0].published
        assert published is not None, "the first result is of a host that publishes"
        self.published = published
        record = {
            "step": step,
            **combine_host_metrics([r.metrics for r in reports]),
            **combine_host_metrics([r.report.metrics for r in results]),
            **timer.metrics(),
            **breakdown,
            "time/elapsed_s": self.clock.elapsed_s(),
        }
        self.previous = record

    def _start_rollouts(self, step: int) -> None:
        """Start every batch the staleness bound s lets start before step `step` trains: batches
        through `step` + s, sampled with the newest published weights (those after update
        `step`, so no batch is more than s updates stale). s = 0: batch `step` alone, on-policy.
        Under `da` each rollout host queues its shares and starts each one as soon as its own
        previous share is done, whatever the other hosts' pace (Section 4.4)."""
        last = min(step + self.plan.staleness, self.plan.steps - 1)
        for batch in range(self.started + 1, last + 1):
            self.pending[batch] = self.transport.start_rollout(batch, self.published)
        self.started = max(self.started, last)

    def _emit(self, exchanged: list[dict[str, Any]] | None) -> None:
        """Step t's record: every host's (O1: `exchanged` from the row exchange; otherwise the
        transport's exchange, which adds what the transport itself measured), reduced."""
        if self.previous is None:
            return
        record = self.previous
        self.previous = None
        record = combine_host_metrics(exchanged or self.transport.exchange(record))
        record["step"] = int(record["step"])
        record["timing/host_orchestration_s"] = host_orchestration_s(record)
        record["timing/host_orchestration_share"] = (
            record["timing/host_orchestration_s"] / record["timing/step_s"]
        )
        record.update(straggler(record))
        self.records.append(record)
        if self.output is not None:
            self.output.export(record)

    def _survive(self, step: int) -> None:
        """After step `step`: a checkpoint when one is due or a stop was asked (step `step`'s
        record is written first), then `RunStopped` on a stop."""
        if self.hooks is None:
            return
        updates, stop = step + 1, self.hooks.stop_requested(step)
        if stop is None and not self.hooks.saves_after(updates):
            return
        self._emit(None)
        self.hooks.checkpoint(updates, self.clock, stopping=stop is not None)
        if stop is not None:
            raise RunStopped(updates, stop)

    def _evaluate(self, step: int) -> None:
        """Held-out accuracy of the newest weights; its wall time is kept off the step clock."""
        start = time.perf_counter()
        accuracy = self.transport.evaluate(self.published, limit=self.plan.eval_limit)
        seconds = time.perf_counter() - start
        if self.output is not None:
            elapsed = self.clock.elapsed_s(start)
            self.output.on_eval(
                Checkpoint(step=step, elapsed_s=elapsed, score=accuracy), seconds=seconds
            )
        self.clock.eval_total_s += seconds


def freeze_gc() -> None:
    """O2 (Table B1): after warm-up, what it allocated is never scanned again."""
    gc.collect()
    gc.freeze()
    gc.disable()


def unfreeze_gc() -> None:
    gc.enable()
    gc.unfreeze()


def straggler(record: dict[str, Any]) -> dict[str, float]:
    """The slowest rollout host's lead over the mean host (Section 4.4: 38% to 55% of the step
    at 128 chips) and its share of the step, from every host's `timing/rollout_host_s`."""
    slowest = record.get("timing/rollout_host_s", 0.0)
    lead = slowest - record.get("timing/rollout_host_s_mean", slowest)
    return {"timing/straggler_s": lead, "timing/straggler_share": lead / record["timing/step_s"]}


def summarize(
    records: list[dict[str, Any]], window: SteadyWindow, *, staleness: int
) -> dict[str, float]:
    """Every placement's summary keys; with staleness, what was achieved in the steady window
    (the overlap where the transport measured it)."""
    summary = summarize_steps(records, window)
    if staleness:
        steady = steady_records(records, window) or records
        summary["staleness_steps_max"] = float(max(r["train/staleness_steps"] for r in steady))
        if "timing/overlap_share" in steady[0]:
            shares = [r["timing/overlap_share"] for r in steady]
            summary["overlap_share_median"] = float(np.median(shares))
        restarts = records[-1].get("da/rollout_restarts", 0)  # only a Ray transport restarts
        if restarts:  # a run without restarts keeps its summary keys (Table 1's runs)
            summary["da/rollout_restarts"] = float(restarts)
    return summary
