"""Warm-up and the steady window: the one definition the step loop (O2), its summary,
`summary.json`, the analysis and the tools all use.

Warm-up: a process's first `WARMUP_STEPS` steps compile its programs. Step 0 compiles
generation, the train step and publication; under `da` the rollout hosts first load published
weights one step later (batch 1 samples with the initial weights, batch 2 with step 0's), so
step 1 still compiles. O2 freezes the garbage collector once they are done (Table B1).

Steady window (Appendix A): with the same batches seen twice or more (`dataset.passes >= 2`,
N = `dataset.batches_per_pass`), the second pass minus its first 3 and last 1 of 20 steps
(steps 23-38 of 40; the same shares for other N); otherwise every step after warm-up. A run
too short for either keeps its last step. Step time is the median over this window.

Plain Python (no jax, no numpy): `locoexp.analysis` imports it where results were copied.
"""

import dataclasses
import math
import statistics
from collections.abc import Iterable
from typing import Any

WARMUP_STEPS = 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class SteadyWindow:
    first: int
    last: int  # inclusive
    rule: str  # how it was chosen, for reports

    def holds(self, step: int) -> bool:
        return self.first <= step <= self.last


def steady_window(
    *, steps: int, batches_per_pass: int | None = None, passes: int = 1
) -> SteadyWindow:
    """The steady steps of a run of `steps` steps (see the module note)."""
    n = batches_per_pass
    if n and passes >= 2:
        first, last = n + math.ceil(3 * n / 20), 2 * n - 1 - math.ceil(n / 20)
        if first <= last < steps:  # a run cut shorter than its second pass falls back below
            return SteadyWindow(first=first, last=last, rule="second pass (Appendix A)")
    return SteadyWindow(
        first=min(WARMUP_STEPS, steps - 1), last=steps - 1, rule="after warm-up (one pass)"
    )


def steady_records(records: Iterable[dict[str, Any]], window: SteadyWindow) -> list[dict]:
    """The step records of `window` (records without a step time, e.g. evaluations, left out)."""
    return [r for r in records if window.holds(r["step"]) and _number(r.get("timing/step_s"))]


def steady_median(
    records: Iterable[dict[str, Any]], key: str, window: SteadyWindow
) -> float | None:
    """Median of `key` over the steady steps that log it; None when none does."""
    values = [float(r[key]) for r in steady_records(records, window) if _number(r.get(key))]
    return statistics.median(values) if values else None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
