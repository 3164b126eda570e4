"""The run's canonical record: `metrics.jsonl`, one JSON line per step, flushed every line.

Also the progress bar and the end-of-run summary a person reads. W&B gets the same records
through `locoexp.metrics.wandb_logger`; this file is written whatever the logger.
"""

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any

from tqdm import tqdm

from locoexp.errors import unwritable


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsFile:
    """Appends records to `<run_dir>/metrics.jsonl` (kept across restarts of the same run)."""

    def __init__(self, path: Path):
        self.path = path
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115  (closed in close())

    def write(self, record: dict[str, Any]) -> None:
        try:
            self._file.write(json.dumps({k: _plain(v) for k, v in record.items()}) + "\n")
            self._file.flush()
        except OSError as error:  # a full disk: one sentence, the lines before it intact
            kept = "its earlier lines are intact (a cut last line is skipped when read)"
            raise unwritable(self.path, error, kept=kept) from None

    def close(self) -> None:
        # every line was flushed as written, so only the line `write` reported can be pending;
        # its error must not replace that sentence while the run's outputs close
        with contextlib.suppress(OSError):
            self._file.close()


def cut_back(path: Path, *, next_step: int) -> tuple[list[dict], list[dict]]:
    """Keep the records of steps before `next_step` (a resumed run's checkpoint) and drop the rest,
    so that every step appears once after the resumed run appends. Returns (kept, dropped).

    The file is rewritten atomically (a complete copy, then a rename): a process killed here
    leaves either the old file or the cut one. A torn last line (a process killed mid-write) is
    dropped."""
    if not path.exists():
        return [], []
    kept: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    lines: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        (kept if record["step"] < next_step else dropped).append(record)
        if record["step"] < next_step:
            lines.append(line)
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    os.replace(partial, path)
    return kept, dropped


class Progress:
    """A progress bar with step, reward and step time."""

    def __init__(self, total: int, *, enabled: bool, done: int = 0):
        self._bar = tqdm(
            total=total,
            initial=done,
            desc="grpo",
            unit="step",
            disable=not enabled,
            dynamic_ncols=True,
        )

    def update(self, record: dict[str, Any]) -> None:
        self._bar.set_postfix(
            reward=f"{record.get('rollout/reward_mean', float('nan')):.3f}",
            step_s=f"{record.get('timing/step_s', float('nan')):.2f}",
            refresh=False,
        )
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def format_summary(summary: dict[str, Any]) -> str:
    """A few lines a person reads at the end of a run."""
    lines = ["run summary:"]
    for key, value in summary.items():
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        lines.append(f"  {key:<28} {shown}")
    return "\n".join(lines)
