"""What only a `placement=da` run records: its summary additions (staleness, overlap) and the
batch ledger (`batches.jsonl`: every batch trained exactly once, with the scheduled prompts).
The common records are `locoexp.metrics.run_output.RunOutput`'s.
"""

import json
from pathlib import Path

import numpy as np

from locoexp.dataset.schedule import PromptSchedule
from locoexp.metrics.run_output import summarize_steps


def summarize(records: list[dict]) -> dict[str, float]:
    """`co`'s summary keys plus the staleness and overlap that `da` achieved after warm-up."""
    steady = records[1:] or records
    return {
        **summarize_steps(records),
        "staleness_steps_max": float(max(r["train/staleness_steps"] for r in steady)),
        "overlap_share_median": float(np.median([r["timing/overlap_share"] for r in steady])),
    }


class BatchLedger:
    """Each step's batch must be trained exactly once, with exactly the scheduled prompts."""

    def __init__(self, schedule: PromptSchedule, example_ids: list[int], path: Path):
        self.schedule, self.example_ids = schedule, example_ids
        self.trained: list[int] = []
        self._file = path.open("a", encoding="utf-8")

    def record(self, step: int, trained_ids: list[int], versions: list[int]) -> None:
        scheduled = [self.example_ids[i] for i in self.schedule.batch(step)]
        if step in self.trained or sorted(trained_ids) != sorted(scheduled):
            raise RuntimeError(
                f"step {step}: trained prompts {sorted(trained_ids)} are not batch {step}'s "
                f"{sorted(scheduled)} exactly once (already trained: {step in self.trained})"
            )
        self.trained.append(step)
        line = {"step": step, "example_ids": trained_ids, "weight_versions": versions}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
