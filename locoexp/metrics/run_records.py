"""Read a finished (or running) run directory: its metrics.jsonl and its resolved config.

The run directory is Hydra's output directory: `metrics.jsonl` (one JSON object per line: step
records, and eval records carrying `eval/accuracy`), and the resolved config in
`.hydra/config.yaml` or `config.yaml`. Only the labels needed to group runs (placement, chips)
and to price them are taken from the config. Read-only; no jax.
"""

import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml

from locoexp.layout import PlacementKind, minimal_hosts
from locoexp.metrics.cost import Checkpoint, checkpoints_from_records

METRICS_FILE = "metrics.jsonl"
CONFIG_FILES = (".hydra/config.yaml", "config.yaml")
EVAL_KEY = "eval/accuracy"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunRecords:
    run_dir: Path
    placement: str
    chips: int
    chip_hour_price_usd: float
    steps: list[dict[str, Any]]  # step records in file order
    evals: list[dict[str, Any]]  # eval records (held-out scores at checkpoints)

    @property
    def group(self) -> str:
        """The comparison group: placement and chips (seeds of one cell share it)."""
        return f"{self.placement}, {self.chips} chips"

    @property
    def name(self) -> str:
        return self.run_dir.name

    def checkpoints(self) -> list[Checkpoint]:
        """Scored checkpoints, timed by the step records they follow (Appendix I.1)."""
        return checkpoints_from_records(self.steps + self.evals, score_key=EVAL_KEY)


def read_run(run_dir: Path) -> RunRecords:
    run_dir = Path(run_dir)
    records = read_metrics_jsonl(run_dir / METRICS_FILE)
    config = read_run_config(run_dir)
    hardware = config.get("hardware") or {}
    return RunRecords(
        run_dir=run_dir,
        placement=str((config.get("placement") or {}).get("kind", "unknown")),
        chips=count_chips(config),
        chip_hour_price_usd=float(hardware.get("chip_hour_price_usd") or 0.0),
        steps=[r for r in records if EVAL_KEY not in r],
        evals=[r for r in records if EVAL_KEY in r],
    )


def read_metrics_jsonl(path: Path) -> list[dict[str, Any]]:
    """All records; a last line cut short by a crash is skipped, a bad line elsewhere raises."""
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {path.parent} a locoexp run directory?")
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not a JSON object: {line[:80]!r}") from None
    return records


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The resolved config as a plain dict; {} when the run directory has none."""
    for name in CONFIG_FILES:
        path = run_dir / name
        if path.exists():
            return yaml.safe_load(path.read_text()) or {}
    return {}


def count_chips(config: dict[str, Any]) -> int:
    """`hardware.chips` when the config records it, else hosts x chips per host (as
    HardwareConfig.chips); with `hardware.hosts: null` (the smallest count the placement needs,
    resolved at start-up and not in Hydra's file) it is resolved as the run did (`minimal_hosts`);
    0 (unknown) when the config says neither."""
    hardware = config.get("hardware") or {}
    if "chips" in hardware:
        return int(hardware["chips"])
    if "hosts" not in hardware or "chips_per_host" not in hardware:
        return 0
    if hardware["hosts"] is None:
        placement = config.get("placement") or {}
        kind = PlacementKind(placement.get("kind", PlacementKind.co.value))
        return minimal_hosts(kind, split=config.get("split")) * int(hardware["chips_per_host"])
    return int(hardware["hosts"]) * int(hardware["chips_per_host"])
