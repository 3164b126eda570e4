"""What a run leaves behind, written by process 0 (or the Ray driver) in one format for every
placement: `metrics.jsonl` (one line per step and per evaluation), the logger (W&B or none),
the progress bar, and `summary.json` with cost-to-learn (Appendix I.1: chips x wall time to the
first of two consecutive scored checkpoints that clear the target, evaluation excluded).

A resumed run (`resume_from=<the checkpoint's next step>`) cuts `metrics.jsonl` back to the
checkpoint before appending, so every step appears once (a run that starts over drops every
earlier record); its summary and cost-to-learn cover the whole run (the scored checkpoints of
every attempt; App. I.1's clock: `cost.resumed_elapsed_s`). The same W&B run continues without
relogging the steps it already holds.

It owns files and the logger only; it never starts processes or reads clocks of its own.
"""

import contextlib
import dataclasses
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from locoexp.errors import ConfigError
from locoexp.metrics.config import LoggerConfig
from locoexp.metrics.cost import Checkpoint, compute_cost_to_learn
from locoexp.metrics.record import MetricsFile, Progress, cut_back, format_summary
from locoexp.metrics.steady import SteadyWindow, steady_median, steady_window
from locoexp.metrics.wandb_logger import build_logger


class RunOutput:
    """The run directory's records, the logger and the progress bar of one run."""

    def __init__(
        self,
        run_dir: Path,
        *,
        logger: LoggerConfig,
        resolved_config: dict[str, Any],
        sweep_name: str | None,
        steps: int,
        progress: bool,
        resume_from: int | None = None,
        scored: Sequence[Checkpoint] = (),
    ):
        """`resume_from`: the next step of the checkpoint a resumed run continues from (None or 0:
        from the start); `scored`: that checkpoint's scored checkpoints."""
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "metrics.jsonl"
        # a run directory's earlier records after the checkpoint (all of them when the run starts
        # over at step 0) are redone by this attempt
        kept, self.dropped = cut_back(path, next_step=resume_from or 0)
        self.earlier_steps = [r for r in kept if "eval/accuracy" not in r]
        self.step_records: list[dict] = []
        self.metrics_file = MetricsFile(path)
        logged = [r["step"] for r in kept + self.dropped]
        self.logger = build_logger(
            logger,
            run_dir=run_dir,
            resolved_config=resolved_config,
            run_name=run_dir.resolve().name,
            sweep_name=sweep_name,
            logged_through_step=max(logged) if logged else None,
        )
        self.bar = Progress(steps, enabled=progress, done=resume_from or 0)
        self.checkpoints: list[Checkpoint] = list(scored)

    def export(self, record: dict) -> None:
        self.step_records.append(record)
        self.metrics_file.write(record)
        self.logger.log(record, step=record["step"])
        self.bar.update(record)

    def on_eval(self, checkpoint: Checkpoint, *, seconds: float) -> None:
        self.checkpoints.append(checkpoint)
        record = {
            "step": checkpoint.step,
            "eval/accuracy": checkpoint.score,
            "eval/seconds": seconds,
            "time/elapsed_s": checkpoint.elapsed_s,
        }
        self.metrics_file.write(record)
        self.logger.log(record, step=checkpoint.step)

    def finish(
        self,
        summary: dict,
        *,
        target: float,
        chips: int,
        chip_hour_price_usd: float,
        wall_s: float,
        steady: SteadyWindow | None = None,
    ) -> dict[str, Any]:
        """Add eval and cost to the summary, write `summary.json`, hand it to the logger. After a
        resume the step keys of `summarize_steps` are recomputed over every attempt's steps
        (`steady`: the run's steady window; None = the steps after warm-up)."""
        if self.earlier_steps:
            records = self.earlier_steps + self.step_records
            summary = {**summary, **summarize_steps(records, steady)}
        cost = compute_cost_to_learn(
            self.checkpoints, target=target, chips=chips, chip_hour_price_usd=chip_hour_price_usd
        )
        summary = {
            **summary,
            "eval_accuracy": self.checkpoints[-1].score,
            **cost.as_metrics(),
            "wall_s": wall_s,
        }
        self.logger.summary(summary)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(format_summary(summary), flush=True)
        return summary

    def close(self, *, failed: bool = False) -> None:
        """`failed`: the run ends with an error of its own, which closing must not replace."""
        self.bar.close()
        self.metrics_file.close()
        self.logger.finish(failed=failed)


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """Where a run writes and under which names (plain values: host processes receive it)."""

    run_dir: str
    resolved_config: dict[str, Any] | None
    sweep_name: str | None
    progress: bool

    @contextlib.contextmanager
    def open(
        self, logger: LoggerConfig, *, steps: int, leader: bool, survival=None
    ) -> Iterator[Any]:
        """The run's `RunOutput` on the leader (None elsewhere), closed however the run ends.
        `survival`: the restored checkpoint's `RunProgress` of a resumed run, else None."""
        if not leader:
            yield None
            return
        output = RunOutput(
            Path(self.run_dir),
            logger=logger,
            resolved_config=self.resolved_config or {},
            sweep_name=self.sweep_name,
            steps=steps,
            progress=self.progress,
            resume_from=survival.next_step if survival else None,
            scored=survival.scored if survival else (),
        )
        try:
            yield output
        except ConfigError:  # its one sentence ends the run (a full disk): closing stays quiet
            output.close(failed=True)
            raise
        except BaseException:
            output.close()
            raise
        output.close()


def summarize_steps(records: list[dict], window: SteadyWindow | None = None) -> dict[str, float]:
    """The summary keys every placement reports: steps, reward of the first and last 5 steps,
    median step time over the steady window (`metrics.steady`; None: the steps after warm-up
    of a run that ends at the last record), warm-up excluded."""
    first, last = records[: min(5, len(records))], records[-min(5, len(records)) :]
    window = window or steady_window(steps=records[-1]["step"] + 1)
    step_s = steady_median(records, "timing/step_s", window)
    if step_s is None:  # stopped before its steady window: every step it ran
        step_s = float(np.median([r["timing/step_s"] for r in records]))
    return {
        "steps": len(records),
        "reward_first5": float(np.mean([r["rollout/reward_mean"] for r in first])),
        "reward_last5": float(np.mean([r["rollout/reward_mean"] for r in last])),
        "step_s_median": step_s,
    }
