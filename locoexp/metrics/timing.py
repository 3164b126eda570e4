"""Per-step phase timing (`timing/*` keys) and the reduction of per-host values to max and mean.

A `StepTimer` measures one step and the phases inside it with `time.perf_counter`; the phases
need not cover the step, and what they leave out is reported as `timing/unaccounted_s`, so the
phases always add up to the step time. It reads host clocks only: it never blocks on devices, so
a caller that wants device time inside a phase must block there itself (`jax.block_until_ready`).
This module must stay tiny and free of jax: it runs on the hot path once per phase.
"""

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence

from locoexp.metrics import compiles


class StepTimer:
    """Times one step at a time; phases are `with timer.phase("generation"):` blocks inside
    `with timer.step():`. A phase entered twice in one step accumulates; phases do not nest.

    After the step, `metrics()` gives `timing/<phase>_s` for every phase entered, `timing/step_s`,
    `timing/unaccounted_s = step_s - sum(phases)` and `timing/compile_s`, the seconds of the
    compile events inside the step (`metrics.compiles`; the timer starts their listener).
    """

    def __init__(self):
        self._phases_s: dict[str, float] = {}
        self._step_start: float | None = None
        self._step_s: float | None = None
        self._in_phase: str | None = None
        self._compiled_before = 0.0
        self._compile_s = 0.0
        compiles.listen()

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        if self._step_start is not None:
            raise RuntimeError("StepTimer.step() is already open: steps do not nest.")
        self._phases_s = {}
        self._step_s = None
        self._compiled_before = compiles.total_s()
        self._step_start = time.perf_counter()
        try:
            yield
        finally:
            self._step_s = time.perf_counter() - self._step_start
            self._compile_s = compiles.total_s() - self._compiled_before
            self._step_start = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self._step_start is None:
            raise RuntimeError(f"StepTimer.phase({name!r}) must run inside StepTimer.step().")
        if self._in_phase is not None:
            # Nested phases would be counted twice and break step = sum(phases) + unaccounted.
            raise RuntimeError(f"StepTimer.phase({name!r}) is inside phase {self._in_phase!r}.")
        self._in_phase = name
        start = time.perf_counter()
        try:
            yield
        finally:
            self._phases_s[name] = self._phases_s.get(name, 0.0) + time.perf_counter() - start
            self._in_phase = None

    def elapsed_s(self) -> float:
        """Seconds since the open step started (Figure 5's head interval is this, read when
        generation starts)."""
        if self._step_start is None:
            raise RuntimeError("StepTimer.elapsed_s() must run inside StepTimer.step().")
        return time.perf_counter() - self._step_start

    def metrics(self) -> dict[str, float]:
        """The finished step's `timing/*` record (seconds)."""
        if self._step_s is None:
            raise RuntimeError("StepTimer.metrics() needs a finished step(): none has closed yet.")
        record = {f"timing/{name}_s": seconds for name, seconds in self._phases_s.items()}
        record["timing/step_s"] = self._step_s
        record["timing/unaccounted_s"] = self._step_s - sum(self._phases_s.values())
        record[compiles.COMPILE_KEY] = self._compile_s
        return record


def reduce_over_hosts(per_host: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One record per host (H records, same keys) -> `<key>_max` and `<key>_mean` per key.

    The max is what a synchronous step waits for; max over mean is the straggler term of
    Section 4.4 (slowest host's rollout against the mean host's).
    """
    if not per_host:
        raise ValueError("reduce_over_hosts needs at least one host's record, got none.")
    keys = per_host[0].keys()
    for host, record in enumerate(per_host):
        if record.keys() != keys:
            raise ValueError(f"host {host} reports keys {sorted(record)}, host 0 {sorted(keys)}.")
    reduced = {}
    for key in keys:
        values = [float(record[key]) for record in per_host]
        reduced[f"{key}_max"] = max(values)
        reduced[f"{key}_mean"] = sum(values) / len(values)
    return reduced


# Phases that are host work only (no device program in flight): Section 3.2's host orchestration
# as the phase clocks see it. A profiled step's trace gives the exact split (`breakdown/*`).
HOST_PHASES = ("admission", "reward", "pack", "log")


def host_orchestration_s(times: Mapping[str, float]) -> float:
    """Seconds of host orchestration in one `timing/*` record: the host phases it has plus
    the unaccounted remainder (dispatch and Python between phases)."""
    host = sum(times.get(f"timing/{p}_s", 0.0) for p in HOST_PHASES)
    return host + times.get("timing/unaccounted_s", 0.0)
