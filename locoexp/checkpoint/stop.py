"""Stopping a run cleanly on SIGTERM or SIGINT: finish the running step, checkpoint it, say how
to resume, exit without a traceback.

`StopSignals` replaces the default handlers while a run is live: a signal only sets a flag (no
KeyboardInterrupt unwinding through jitted code or collectives), and the step loop asks
`stop_agreed` at the end of each step. Hosts must stop after the same step so that they save the
same checkpoint: with several hosts the flags are combined with one small all-gather; on TPU,
JAX's preemption notice (`multihost_utils.reached_preemption_sync_point`) also counts, which
every host reaches at the same step. A second signal while stopping leaves the run at once
(unless it comes within `REPEAT_GRACE_S` of the first: Ctrl-C reaches every local host process
directly and the launcher forwards it too, and that is still one request): the process exits
with 128 + the signal at the next bytecode, without unwinding (no SystemExit through jitted code,
threads or collectives, so no tracebacks), the running step unsaved and the last checkpoint
intact; the run's top process says so in one sentence (a spawned host process leaves that to
its launcher, which reports its exit code as a stop).

This module never saves anything itself and never decides what the loop does after a stop.
"""

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_GRACE_S = 2.0
STOPPED_EXIT_CODES = tuple(128 + int(n) for n in STOP_SIGNALS)  # a host that stopped cleanly


# what `signal.signal` takes and returns: a handler, SIG_DFL / SIG_IGN, or None (not from Python)
_Handler = Callable[[int, FrameType | None], Any] | int | None


class RunStopped(Exception):  # noqa: N818  (a stop is the normal end of a stopped run)
    """The run stopped on a signal after `next_step` steps; a checkpoint holds them."""

    def __init__(self, next_step: int, signal_number: int):
        super().__init__(f"stopped by {signal.Signals(signal_number).name} after {next_step} steps")
        self.next_step = next_step
        self.signal_number = signal_number

    @property
    def exit_code(self) -> int:
        return 128 + self.signal_number  # the shell's convention for a signal's exit status


class StopSignals:
    """SIGTERM/SIGINT set `received` (the first signal's number) while installed; `run_dir`:
    where a second signal's sentence finds the last checkpoint."""

    def __init__(self, run_dir: str | Path = "."):
        self.run_dir = Path(run_dir)
        self.received: int | None = None
        self._received_at = 0.0
        self._previous: dict[int, _Handler] = {}

    def install(self) -> "StopSignals":
        """Take SIGTERM/SIGINT; called again, take them back from a handler installed since (a
        Ray driver's `ray.init` installs its own) and keep the handlers found the first time."""
        for number in STOP_SIGNALS:
            previous = signal.signal(number, self._handle)
            self._previous.setdefault(number, previous)
        return self

    def uninstall(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _handle(self, number: int, frame) -> None:
        if self.received is None:
            self.received, self._received_at = number, time.monotonic()
        elif time.monotonic() - self._received_at > REPEAT_GRACE_S:  # leave now, no checkpoint
            if multiprocessing.parent_process() is None:  # the run's top process speaks
                os.write(2, (abandoned_line(self.run_dir, number) + "\n").encode())
            os._exit(128 + number)

    def __enter__(self) -> "StopSignals":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()


def abandoned_line(run_dir: Path, number: int) -> str:
    """One sentence for a run left at once on a second signal: what is kept, how to go on."""
    # imported here: run.py imports this module before jax may load; by a signal the session
    # has imported it
    from locoexp.checkpoint.state import latest_saved_step  # noqa: PLC0415

    step = latest_saved_step(run_dir)
    kept = (
        "no checkpoint was saved yet, so rerun the command to start again"
        if step is None
        else f"the checkpoint after step {step} in {run_dir}/checkpoints is intact: rerun the "
        "same command (same hydra.run.dir) to resume from it"
    )
    name = signal.Signals(number).name
    return f"stopped at once by a second {name}, the running step unsaved; {kept}."


def stop_agreed(
    signals: StopSignals,
    *,
    step: int,
    allgather: Callable[[np.ndarray], np.ndarray] | None,
    preemption_sync: bool,
) -> int | None:
    """After step `step`: the signal number every host stops on, or None to continue.

    `allgather`: the hosts' all-gather (None for one host); `preemption_sync`: ask JAX whether
    the TPU slice is being preempted (every host reaches the same answer at the same step)."""
    local = signals.received or 0
    if preemption_sync:
        from jax.experimental import multihost_utils  # noqa: PLC0415

        if multihost_utils.reached_preemption_sync_point(step):
            local = local or int(signal.SIGTERM)
    if allgather is not None:
        local = int(allgather(np.array([local], np.int64)).max())
    return local or None
