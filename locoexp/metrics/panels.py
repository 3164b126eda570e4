"""The report's panels as data: which metrics each panel shows, against what, grouped by what.

One definition feeds both drawers, so the W&B workspace (tools/dashboard_wandb.py) and the local
PNG figures (`python -m locoexp.analysis figures`) show the same panels. Keys are those of
metrics.jsonl and of the run summary (`cost/*`, see locoexp/metrics/cost.py). This module is
data only: no W&B, no matplotlib.
"""

import dataclasses
import enum

STEP_KEY = "step"
# Algorithm 1's phases in step order; `unaccounted` closes the sum to timing/step_s.
PHASES = ("admission", "generation", "reward", "pack", "train", "publish", "log", "unaccounted")
PHASE_KEYS = tuple(f"timing/{phase}_s" for phase in PHASES)
# Runs are compared by design (placement) and scale (chips): both are keys of the resolved config.
GROUP_BY = ("placement.kind", "hardware.chips")


class PanelKind(enum.Enum):
    line = "line"  # ys against the global step, one line per run or group
    stacked = "stacked"  # ys stacked: per step (W&B) or as one bar per run of steady means (PNG)
    bar = "bar"  # one summary value per run or group


@dataclasses.dataclass(frozen=True, kw_only=True)
class Panel:
    title: str
    kind: PanelKind
    ys: tuple[str, ...]
    y_label: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Section:
    name: str
    panels: tuple[Panel, ...]


SECTIONS = (
    Section(
        name="Step time",
        panels=(
            Panel(
                title="Step time by phase",
                kind=PanelKind.stacked,
                ys=PHASE_KEYS,
                y_label="seconds per step",
            ),
            Panel(
                title="Step time",
                kind=PanelKind.line,
                ys=("timing/step_s",),
                y_label="seconds per step",
            ),
            Panel(
                title="Host-orchestration share",
                kind=PanelKind.line,
                ys=("timing/host_orchestration_share",),
                y_label="share of step time",
            ),
            Panel(
                title="Decode time per iteration",
                kind=PanelKind.line,
                ys=("rollout/decode_ms_per_iteration",),
                y_label="ms per decode iteration (prefill excluded)",
            ),
        ),
    ),
    Section(
        name="Learning",
        panels=(
            Panel(
                title="Reward",
                kind=PanelKind.line,
                ys=("rollout/reward_mean",),
                y_label="mean reward",
            ),
            Panel(
                title="Held-out accuracy",
                kind=PanelKind.line,
                ys=("eval/accuracy",),
                y_label="accuracy",
            ),
        ),
    ),
    Section(
        name="Cost-to-learn",
        panels=(
            Panel(
                title="Chip-hours to the target",
                kind=PanelKind.bar,
                ys=("cost/chip_hours",),
                y_label="chip-hours (Appendix I.1)",
            ),
            Panel(
                title="Cost to the target",
                kind=PanelKind.bar,
                ys=("cost/usd",),
                y_label="USD at the hardware's chip-hour price",
            ),
        ),
    ),
)
