"""Run directories as analysis input: records, config labels, the steady window, launches pooled.

A run directory is what `python run.py` leaves (`metrics.jsonl`, `.hydra/config.yaml`,
`summary.json`); a sweep directory holds one run directory per job. This module finds runs,
labels them by the config keys the paper's tables vary (placement, chips, hosts, split,
workload, model, levers) and picks Appendix A's steady window. It never imports jax or Hydra.
"""

import dataclasses
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from locoexp.errors import ConfigError
from locoexp.metrics.run_records import METRICS_FILE, RunRecords, read_run, read_run_config
from locoexp.metrics.steady import SteadyWindow, steady_records
from locoexp.metrics.steady import steady_median as median_over
from locoexp.metrics.steady import steady_window as metrics_steady_window

STEP_TIME = "timing/step_s"
LEVER_KEYS = ("metrics_off_barrier", "freeze_gc", "balance_prompts", "publish_in_one_call")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """One run directory: its records and the config it ran with (a plain dict)."""

    records: RunRecords
    config: dict[str, Any]
    summary: dict[str, Any]

    @property
    def run_dir(self) -> Path:
        return self.records.run_dir

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.records.steps

    def get(self, dotted: str, default: Any = None) -> Any:
        """A config value by dotted key (`placement.kind`), or `default` when absent."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def placement(self) -> str:
        return self.records.placement

    @property
    def hosts(self) -> int:
        return int(self.get("hardware.hosts", 0) or 0)

    @property
    def chips(self) -> int:
        return self.records.chips

    @property
    def split(self) -> float | None:
        return self.get("split")

    @property
    def launch(self) -> int:
        return int(self.get("launch", 0) or 0)

    @property
    def seed(self) -> int:
        return int(self.get("seed", 0) or 0)

    @property
    def arm(self) -> str:
        """The arm as the paper names it: Pathways-style, LoCoJAX base/optimized, DA split."""
        levers = [bool(self.get(f"opt.{k}", False)) for k in LEVER_KEYS]
        if self.placement == "da":
            return f"da {self.split:g}"
        if self.placement == "single_controller":
            return "single_controller"
        if all(levers):
            return "co optimized"
        if not any(levers):
            return "co base"
        off = [f"O{i}" for i, on in enumerate(levers, 1) if not on]
        return f"co {'+'.join(off)} off"

    @property
    def workload(self) -> str:
        return str(self.get("dataset.kind", "unknown"))

    @property
    def model(self) -> str:
        name = self.get("model.name", "model")
        width = self.get("model.hidden_dim")
        return f"{name} (D={width})" if name in ("tiny", "tiny_qwen") and width else str(name)

    @property
    def unit(self) -> str:
        """What the chip count counts: TPU chips, or local host processes of hardware=cpu."""
        return "CPU hosts" if self.get("hardware.chip") == "cpu" else "chips"

    @property
    def label(self) -> str:
        return f"{self.workload} | {self.arm} | {self.chips} {self.unit}"


def read(run_dir: Path) -> Run:
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return Run(records=read_run(run_dir), config=read_run_config(run_dir), summary=summary)


def find_runs(paths: Iterable[Path]) -> list[Run]:
    """Every run under `paths`: a run directory itself, or the run directories below a sweep."""
    found: list[Run] = []
    for path in map(Path, paths):
        if (path / METRICS_FILE).exists():
            found.append(read(path))
            continue
        if not path.is_dir():
            raise ConfigError(f"{path} is neither a run directory nor a sweep directory.")
        below = sorted(p.parent for p in path.rglob(METRICS_FILE))
        if not below:
            raise ConfigError(f"{path} holds no run directory (no {METRICS_FILE} below it).")
        found.extend(read(p) for p in below)
    return found


def select(runs: Sequence[Run], filters: Sequence[str]) -> list[Run]:
    """The runs whose config matches every `key=value` filter (values compared as text)."""
    wanted = []
    for item in filters:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"filter {item!r} must read key=value, e.g. placement.kind=co.")
        wanted.append((key, value))
    return [r for r in runs if all(_text(r.get(k)) == v for k, v in wanted)]


# Config keys (and groups) that differ between the runs of one cell: its launches (Appendix A),
# its seeds (Appendix I), and where and how each run logs or resumes.
REPEAT_KEYS = ("launch", "seed", "logger", "hardware.process_id", "resume")


def cell_differences(runs: Sequence[Run]) -> dict[str, list[str]]:
    """The config keys whose values differ among `runs` (as `select` compares them), besides
    `REPEAT_KEYS`, the keys with the most values first: empty when the runs are launches or seeds
    of one cell."""
    flats = [_flatten(r.config) for r in runs]
    differ: dict[str, list[str]] = {}
    for key in sorted(set().union(*flats)):
        if any(key == k or key.startswith(k + ".") for k in REPEAT_KEYS):
            continue
        values = sorted({_text(f.get(key)) for f in flats}, key=_numbers_first)
        if len(values) > 1:
            differ[key] = values
    return dict(sorted(differ.items(), key=lambda kv: -len(kv[1])))  # the swept key first


def require_one_cell(runs: Sequence[Run], arm: str, how: str) -> None:
    """Refuse an arm that pools runs of different cells as if they were its launches (a sweep's
    `placement.kind=da` matched every split): one sentence naming the keys and a filter."""
    differ = cell_differences(runs)
    if not differ:
        return
    shown = "; ".join(f"{k} ({', '.join(v)})" for k, v in list(differ.items())[:3])
    more = f" and {len(differ) - 3} more keys" if len(differ) > 3 else ""
    key, values = next(iter(differ.items()))
    raise ConfigError(
        f"the {arm} arm holds {len(runs)} runs of more than one cell, differing in {shown}{more}; "
        f"an arm is one cell's launches and seeds (Appendix A): {how}, e.g. {key}={values[0]}."
    )


def _numbers_first(text: str) -> tuple:
    """Sort key: numbers by value (4 before 16), then other text."""
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def steady_window(run: Run, *, override: str | None = None) -> SteadyWindow:
    """The run's steady window (`locoexp.metrics.steady`: Appendix A's second pass, else the
    steps after warm-up), or the window `--steady=FIRST:LAST` gives."""
    if override:
        first, sep, last = override.partition(":")
        if not sep or not first.isdigit() or not last.isdigit() or int(first) > int(last):
            raise ConfigError(f"--steady={override!r} must read FIRST:LAST, e.g. 23:38.")
        return SteadyWindow(first=int(first), last=int(last), rule="given")
    return metrics_steady_window(
        steps=int(run.get("steps", len(run.steps)) or len(run.steps)),
        batches_per_pass=run.get("dataset.batches_per_pass"),
        passes=int(run.get("dataset.passes", 1) or 1),
    )


def steady_steps(run: Run, *, override: str | None = None) -> list[dict[str, Any]]:
    return steady_records(run.steps, steady_window(run, override=override))


def processed_tokens(record: dict[str, Any]) -> float:
    """Prompt plus completion tokens of a step (the per-token basis of Section 3.3)."""
    return float(record["rollout/tokens_in"]) + float(record["rollout/tokens_out"])


def steady_median(run: Run, key: str, *, override: str | None = None) -> float | None:
    """Median of `key` over the steady window; None when no steady step logs it."""
    return median_over(run.steps, key, steady_window(run, override=override))
