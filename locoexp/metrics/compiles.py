"""Compile events: the seconds this process spends compiling, counted into the step they fall in.

A compile is the first call of a jitted program at a new shape (or an ahead-of-time
`.lower().compile()`). JAX reports each one's top-level tracing, its lowering to MLIR and XLA's
backend compile (a persistent-cache hit: its retrieval) to `jax.monitoring` listeners, in the
thread that compiles, where the program is first run. `listen()` adds one listener per process
that adds those durations to a running total; `StepTimer` reads the total when a step opens and
closes, so a step's `timing/compile_s` is exactly the compile seconds inside it (0.0 when none),
and compiles outside every step (start-up, evaluation) are in no step's record. Under `da` each
Ray actor's report renames it `timing/<side>_compile_s`, so a record holds every side's.

Appendix A scores the median step, which drops compiling steps; where scored steps recompile,
`analysis.compare` charges these recorded seconds back. This module imports jax only inside
`listen()`: the analysis reads `compile_seconds` from records without jax.
"""

import threading
from collections.abc import Mapping
from typing import Any

COMPILE_KEY = "timing/compile_s"
# every key a step record carries compile seconds under: this process's, and under `da` the
# rollout and trainer actors' (`placement.ray.hosts.side_report`)
RECORD_KEYS = (COMPILE_KEY, "timing/rollout_compile_s", "timing/trainer_compile_s")
# jax._src.dispatch's events of one compile; tracing is reported for top-level traces only
EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)

_lock = threading.Lock()
_total_s = 0.0
_listening = False


def _on_duration(event: str, duration_secs: float, **_: str | int) -> None:
    global _total_s
    if event in EVENTS:
        with _lock:
            _total_s += duration_secs


def listen() -> None:
    """Count this process's compile seconds from now on (once per process; idempotent)."""
    global _listening
    with _lock:
        if _listening:
            return
        _listening = True
    import jax.monitoring  # noqa: PLC0415  (the analysis imports this module without jax)

    jax.monitoring.register_event_duration_secs_listener(_on_duration)


def total_s() -> float:
    """Compile seconds this process has spent since `listen()`."""
    with _lock:
        return _total_s


def compile_seconds(record: Mapping[str, Any]) -> float | None:
    """A step record's recorded compile seconds, every side's summed; None when the record
    carries none (a run written before compile events were recorded)."""
    values = [float(record[key] or 0.0) for key in RECORD_KEYS if key in record]
    return sum(values) if values else None
