"""`placement=da` (LoCoJAX-DA, Section 2 and 4.4): a Ray driver for separate trainer and rollout
hosts with one-step-stale rollouts.

Ray places one actor per host (`ray_actors.py`): `split x H` trainer hosts form their own
`jax.distributed` group and train FSDP over their devices; the other hosts each run their own
engine. The schedule (the paper's one-step staleness): while the trainer trains on batch t, the
rollout hosts generate batch t+1 with the weights published after step t-1, so after the warm-up
step every trained sample is exactly one update old and the loss importance-weights it
(truncated IS, `algo.tis_cap`, in the trainer). Weights travel through Ray's object store with a
version number (= updates applied); rollout data carry that version and their behaviour log-probs.
Batch t is `PromptSchedule.batch(t)`, as under `co`, its groups split across rollout hosts; the
driver checks that every batch is trained exactly once (`BatchLedger`, `batches.jsonl`).

Records: `metrics.jsonl` rows have the `co` keys where they mean the same thing. Rollout-side
timings (`load`, `admission`, `generation`, `reward`, `rollout`) are those of the batch trained at
that step; trainer-side (`transfer`, `pack`, `train`, `publish`, `trainer`) of that step;
`timing/step_s` is the driver's period; `timing/trainer_idle_s` the trainer's wait for data;
`timing/overlap_s` how long step t's training ran alongside batch t+1's generation. Every actor
and Ray itself stop when the run ends or fails. Evaluation wall time is kept off the clock.
"""

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

from locoexp.errors import require
from locoexp.hardware.config import ChipKind
from locoexp.metrics.cost import Checkpoint
from locoexp.metrics.run_output import RunOutput
from locoexp.metrics.timing import StepTimer
from locoexp.placement.da_output import BatchLedger, summarize
from locoexp.placement.multihost import combine_host_metrics
from locoexp.placement.ray_cluster import DaLayout, HostParts, Hosts, start_hosts, start_ray
from locoexp.trainer.divergence import require_finite_step


def run_da(
    config,
    *,
    run_dir: str | Path,
    resolved_config: dict[str, Any] | None,
    sweep_name: str | None,
    progress: bool,
) -> dict[str, Any]:
    """The entry from `locoexp.main.run` for placement=da, and the one function of this module
    that reads the root `Config`: it checks the split's shapes, builds the pieces, runs."""
    from locoexp import main  # noqa: PLC0415  (main imports this module; its builders are reused)

    start_time = time.perf_counter()
    roles, d, hw = main.placement_roles(config), config.dataset, config.hardware
    check_da_shapes(
        d.prompts_per_step,
        d.samples_per_prompt,
        trainer_hosts=roles.trainer_hosts,
        rollout_hosts=roles.rollout_hosts,
    )
    task = main.build_checked_task(config)
    parts = HostParts(
        model=config.model,
        rollout=config.rollout,
        dataset=d,
        algo=config.algo,
        trainer=config.trainer,
        settings=main.build_settings(config, local_devices=hw.devices_per_host),
        schedule=main.build_schedule(config, len(task.train)),
    )
    layout = DaLayout(
        trainer_hosts=roles.trainer_hosts,
        rollout_hosts=roles.rollout_hosts,
        devices_per_host=hw.devices_per_host,
        cpu_devices=hw.chip is ChipKind.cpu,
        ray_address=config.placement.ray_address,
    )
    plan = LoopPlan(
        steps=config.steps,
        eval_every_steps=config.eval_every_steps,
        eval_at_updates=list(config.eval_at_updates),
        eval_limit=d.eval_size,
    )
    output = RunOutput(
        Path(run_dir),
        logger=config.logger,
        resolved_config=resolved_config or {},
        sweep_name=sweep_name,
        steps=config.steps,
        progress=progress,
    )
    try:
        summary = run_disaggregated(
            layout,
            parts,
            plan,
            output=output,
            example_ids=[e.id for e in task.train],
            start_time=start_time,
        )
        return output.finish(
            summary,
            target=config.eval_target,
            chips=hw.chips,
            chip_hour_price_usd=hw.chip_hour_price_usd,
            wall_s=time.perf_counter() - start_time,
        )
    finally:
        output.close()


def check_da_shapes(
    prompts_per_step: int, group_size: int, *, trainer_hosts: int, rollout_hosts: int
) -> None:
    """Whole GRPO groups per rollout host; an equal share of sequences per trainer host."""
    require(
        prompts_per_step % rollout_hosts == 0,
        f"dataset.prompts_per_step={prompts_per_step} must be divisible by the {rollout_hosts} "
        "rollout hosts of placement=da (each admits whole GRPO groups).",
    )
    require(
        prompts_per_step * group_size % trainer_hosts == 0,
        f"dataset.prompts_per_step x dataset.samples_per_prompt = {prompts_per_step * group_size} "
        f"sequences must be divisible by the {trainer_hosts} trainer hosts of placement=da.",
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopPlan:
    steps: int
    eval_every_steps: int
    eval_at_updates: list[int]
    eval_limit: int | None

    def evaluates_after(self, updates: int) -> bool:
        every = self.eval_every_steps
        return (
            (every and updates % every == 0)
            or updates in self.eval_at_updates
            or updates == self.steps
        )


def run_disaggregated(
    layout: DaLayout,
    parts: HostParts,
    plan: LoopPlan,
    *,
    output: RunOutput,
    example_ids: list[int],
    start_time: float,
) -> dict[str, Any]:
    """Start Ray and the hosts, run `plan.steps` steps, stop everything; returns the summary."""
    hosts = Hosts()
    ledger = BatchLedger(parts.schedule, example_ids, output.run_dir / "batches.jsonl")
    try:
        start_ray(layout)
        start_hosts(hosts, layout, parts)
        records = _drive(hosts, plan, output=output, ledger=ledger, start_time=start_time)
        return summarize(records)
    finally:
        ledger.close()
        try:
            hosts.stop()
        finally:
            ray.shutdown()


def _drive(
    hosts: Hosts, plan: LoopPlan, *, output: RunOutput, ledger: BatchLedger, start_time: float
) -> list[dict]:
    """The pipelined loop. Step t: wait for batch t, start training on it, start batch t+1 with
    the newest published weights (those after step t-1), wait for training. Step t's record
    waits for batch t+1's rollout windows (its overlap) and is exported at step t+1."""
    timer, records, eval_total_s = StepTimer(), [], 0.0
    pending, published, previous = hosts.generate(0, []), [], None

    def emit(next_rollouts: list[dict] | None) -> None:
        record, trained = previous
        record.update(_overlap(trained, next_rollouts))
        records.append(record)
        output.export(record)

    for step in range(plan.steps):
        with timer.step():
            with timer.phase("trainer_idle"):
                rollouts = ray.get([m for m, _ in pending])
            if previous is not None:
                emit(rollouts)
            data = [d for _, d in pending]
            training = [t.train.remote(step, data) for t in hosts.trainers]
            last = step + 1 == plan.steps
            pending = [] if last else hosts.generate(step + 1, published)
            with timer.phase("trainer_round"):
                trained = ray.get(training)
            require_finite_step(trained[0]["host"], step=step)
        published = trained[0]["published"]
        versions = [r["host"]["rollout/weight_version"] for r in rollouts]
        ledger.record(step, trained[0]["example_ids"], [int(v) for v in versions])
        record = {
            "step": step,
            **_combine(rollouts, trained),
            **timer.metrics(),
            "time/elapsed_s": time.perf_counter() - start_time - eval_total_s,
        }
        previous = (record, trained)
        if plan.evaluates_after(step + 1):
            emit(ray.get([m for m, _ in pending]) if pending else None)
            previous = None
            eval_total_s += _evaluate(
                hosts, published, plan, output, step, start_time, eval_total_s
            )
    if previous is not None:
        emit(None)
    return records


def _combine(rollouts: list[dict], trained: list[dict]) -> dict[str, float]:
    """Rollout hosts' and trainer hosts' metrics -> one record (`co`'s reduction per side)."""
    rollout = combine_host_metrics([r["host"] for r in rollouts])
    trainer = combine_host_metrics([t["host"] for t in trained])
    trainer = {k: v for k, v in trainer.items() if not k.startswith("timing/unaccounted")}
    for suffix in ("", "_mean"):
        if f"timing/step_s{suffix}" in trainer:
            trainer[f"timing/trainer_s{suffix}"] = trainer.pop(f"timing/step_s{suffix}")
    return {**rollout, **trainer}


def _overlap(trained: list[dict], next_rollouts: list[dict] | None) -> dict[str, float]:
    """How long step t's training (transfer to publish) ran alongside batch t+1's rollout."""
    start = min(t["window"]["start"] for t in trained)
    end = max(t["window"]["end"] for t in trained)
    overlap = 0.0
    if next_rollouts:
        r_start = min(r["window"]["start"] for r in next_rollouts)
        r_end = max(r["window"]["end"] for r in next_rollouts)
        overlap = max(0.0, min(end, r_end) - max(start, r_start))
    return {"timing/overlap_s": overlap, "timing/overlap_share": overlap / max(end - start, 1e-9)}


def _evaluate(
    hosts: Hosts,
    published: list,
    plan: LoopPlan,
    output: RunOutput,
    step: int,
    start_time: float,
    eval_total_s: float,
) -> float:
    """Held-out accuracy of the newest weights, each rollout host scoring its share; returns
    the evaluation's wall time (kept off the step clock)."""
    start = time.perf_counter()
    results = ray.get(
        [
            r.evaluate.remote(published, limit=plan.eval_limit, updates=step + 1)
            for r in hosts.rollouts
        ]
    )
    correct, scored = np.sum(results, axis=0)
    seconds = time.perf_counter() - start
    output.on_eval(
        Checkpoint(
            step=step,
            elapsed_s=start - start_time - eval_total_s,
            score=float(correct / max(scored, 1)),
        ),
        seconds=seconds,
    )
    return seconds
