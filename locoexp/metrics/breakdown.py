"""Where a step's time goes, read from a `jax.profiler` trace: compute, network, host orchestration.

The paper splits one profiled step three ways (Figure 1, Figure 3A, Table 2; definitions in
Section 4.1's "Time breakdown" and Table H1):
- compute: device (XLA) op time outside collectives;
- network: collectives (all-gather, reduce-scatter, all-reduce, all-to-all, collective-permute,
  send/recv, NCCL kernels), including the time a device waits in them for its partners (Table
  H1's network is an upper-end estimate that counts those waits), plus the host-side cross-host
  exchanges that locoexp marks with `exchange_annotation` (gloo object exchanges, Ray
  object-store transfers) while no device op runs;
- host orchestration: the rest of the step's wall time, when no device op and no exchange runs
  (dispatch, admission, reward, packing, Python).

Each device's timeline is classified on its own (network before compute before exchange before
host, so nested or concurrent events count once) and the step's shares are the mean over the
devices of the process that wrote the trace; they sum to 1. A process's trace covers its own
devices only: multi-host runs parse one trace per host and reduce them like other per-host
metrics.

`profile_step` captures one step (`jax.profiler.trace`, with a Perfetto trace beside the
TensorBoard `.xplane.pb`) and marks its window with `STEP_ANNOTATION`; `step_breakdown` parses
it. This module reads traces and marks windows; it must not change what a step computes.
"""

import contextlib
import dataclasses
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jax
from jax.profiler import ProfileData

STEP_ANNOTATION = "locoexp_step"
EXCHANGE_PREFIX = "locoexp_exchange:"
_END = "end: "
# HLO collective ops (sync and async -start/-done forms) and GPU collective kernels.
_COLLECTIVE = re.compile(
    r"^(all-gather|all-reduce|reduce-scatter|all-to-all|ragged-all-to-all|collective-permute"
    r"|collective-broadcast|send|recv)([-.]|$)|nccl",
    re.IGNORECASE,
)

Interval = tuple[float, float]


@dataclasses.dataclass(frozen=True)
class Breakdown:
    """One profiled step on one process: seconds per component (mean over its devices)."""

    step_s: float
    compute_s: float
    network_s: float
    host_s: float
    devices: int

    def metrics(self) -> dict[str, float]:
        return {
            "breakdown/step_s": self.step_s,
            "breakdown/compute_share": self.compute_s / self.step_s,
            "breakdown/network_share": self.network_s / self.step_s,
            "breakdown/host_share": self.host_s / self.step_s,
        }


def exchange_annotation(name: str) -> jax.profiler.TraceAnnotation:
    """Mark a host-side cross-host exchange (a gloo object exchange, a Ray object-store get or
    put) so the breakdown counts it as network."""
    return jax.profiler.TraceAnnotation(EXCHANGE_PREFIX + name)


@contextlib.contextmanager
def profile_step(log_dir: Path, step: int) -> Iterator[None]:
    """Capture a trace of the enclosed step into `log_dir` (TensorBoard's
    `plugins/profile/<run>/*.xplane.pb`, and `*.trace.json.gz` for ui.perfetto.dev)."""
    jax.profiler.start_trace(str(log_dir), create_perfetto_trace=True)
    try:
        with jax.profiler.StepTraceAnnotation(STEP_ANNOTATION, step_num=step):
            yield
    finally:
        jax.profiler.stop_trace()


@dataclasses.dataclass(frozen=True)
class StepProfiler:
    """Which steps this process profiles and where their traces go:
    `<run_dir>/profile/step<t>/<role><index>/` (one TensorBoard run per step and process)."""

    run_dir: Path
    steps: frozenset[int]
    role: str = "host"  # "host" (co, single_controller); "rollout" / "trainer" sides of da
    index: int = 0

    def log_dir(self, step: int) -> Path:
        return Path(self.run_dir) / "profile" / f"step{step}" / f"{self.role}{self.index}"

    def capture(self, step: int) -> contextlib.AbstractContextManager:
        """A trace of the enclosed step if it is profiled, else nothing."""
        if step not in self.steps:
            return contextlib.nullcontext()
        return profile_step(self.log_dir(step), step)

    def metrics(self, step: int) -> dict[str, float]:
        """`breakdown/*` of a profiled step (empty for others); parse it after the step."""
        if step not in self.steps:
            return {}
        return step_breakdown(load_trace(trace_file(self.log_dir(step))), step).metrics()


def trace_file(log_dir: Path) -> Path:
    """The `.xplane.pb` a `profile_step` capture wrote under `log_dir` (the newest)."""
    files = sorted(Path(log_dir).glob("plugins/profile/*/*.xplane.pb"))
    if not files:
        raise FileNotFoundError(f"no plugins/profile/*/*.xplane.pb under {log_dir}")
    return files[-1]


def load_trace(path: Path) -> ProfileData:
    return ProfileData.from_file(str(path))


def step_breakdown(profile: ProfileData, step: int) -> Breakdown:
    """Split the wall time of step `step` (its `STEP_ANNOTATION` window) three ways."""
    window = _step_window(profile, step)
    ops, exchanges = _device_ops(profile, window), []
    for event, _ in _events(profile):
        if event.name.startswith(EXCHANGE_PREFIX):
            exchanges.append(_clip(event.start_ns, event.start_ns + event.duration_ns, window))
    exchange = _merge(exchanges)
    per_device = []
    no_ops: list[dict[str, list[Interval]]] = [{"collective": [], "compute": []}]
    for intervals in ops.values() or no_ops:
        network = _merge(intervals["collective"])
        compute = _minus(_merge(intervals["compute"]), network)
        busy = _merge([*network, *compute])
        host_exchange = _minus(exchange, busy)
        per_device.append((_length(compute), _length(network) + _length(host_exchange)))
    step_ns = window[1] - window[0]
    compute_ns = sum(c for c, _ in per_device) / len(per_device)
    network_ns = sum(n for _, n in per_device) / len(per_device)
    return Breakdown(
        step_s=step_ns * 1e-9,
        compute_s=compute_ns * 1e-9,
        network_s=network_ns * 1e-9,
        host_s=(step_ns - compute_ns - network_ns) * 1e-9,
        devices=len(ops),
    )


def _events(profile: ProfileData) -> Iterator[tuple[Any, tuple[str, str]]]:
    """Every event with the (plane, line) it sits on (xprof's events are untyped)."""
    for plane in profile.planes:
        for line in plane.lines:
            for event in line.events:
                yield event, (plane.name, line.name)


def _step_window(profile: ProfileData, step: int) -> Interval:
    for event, _ in _events(profile):
        if event.name == STEP_ANNOTATION and dict(event.stats).get("step_num") == step:
            return event.start_ns, event.start_ns + event.duration_ns
    raise ValueError(f"the trace has no {STEP_ANNOTATION!r} annotation of step {step}")


def _device_ops(profile: ProfileData, window: Interval) -> dict[tuple, dict[str, list]]:
    """Device op intervals inside `window`, by device: XLA op events (a `hlo_op` stat, as CPU and
    GPU traces carry) or the `XLA Ops` line of a `/device:` plane (TPU traces).

    XLA:CPU runs some ops asynchronously: the op's event then covers only its launch, and an
    `end: <op>` event linked to it by a flow id (`_p` on the op, `_c` on the end) marks when it
    finished; such an op lasts from its event's start to its end event."""
    ends = {}
    for event, _ in _events(profile):
        if event.name.startswith(_END):
            flow = dict(event.stats).get("_c")
            if flow is not None:
                ends[(flow, event.name[len(_END) :])] = event.start_ns + event.duration_ns
    ops: dict[tuple, dict[str, list]] = {}
    for event, (plane, line) in _events(profile):
        stats = dict(event.stats)
        if "hlo_op" in stats:
            device, name = (plane, stats.get("device_ordinal")), str(stats["hlo_op"])
        elif plane.startswith("/device:") and line == "XLA Ops":
            device, name = (plane, None), event.name
        else:
            continue
        end = max(event.start_ns + event.duration_ns, ends.get((stats.get("_p"), event.name), 0))
        interval = _clip(event.start_ns, end, window)
        if interval[1] <= interval[0]:
            continue
        kind = "collective" if _COLLECTIVE.search(name) else "compute"
        ops.setdefault(device, {"collective": [], "compute": []})[kind].append(interval)
    return ops


def _clip(start: float, end: float, window: Interval) -> Interval:
    start = max(start, window[0])
    return start, max(start, min(end, window[1]))


def _merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint union of `intervals` (empty ones dropped)."""
    merged: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _minus(intervals: list[Interval], remove: list[Interval]) -> list[Interval]:
    """Parts of `intervals` outside `remove` (both sorted and disjoint, as `_merge` returns)."""
    out, r = [], 0
    for start, end in intervals:
        while r < len(remove) and remove[r][1] <= start:
            r += 1  # removals wholly before this interval never matter again
        k = r
        while k < len(remove) and remove[k][0] < end:
            if remove[k][0] > start:
                out.append((start, remove[k][0]))
            start = max(start, remove[k][1])
            k += 1
        if start < end:
            out.append((start, end))
    return out


def _length(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)
