"""Checkpoint cost on workload W1 (issue 13): seconds per save, and W1's step time with a save in
flight against none, interleaved in one run.

    python tools/bench_checkpoint.py [--pairs 2] [--json PATH]

W1 is `tools/bench_w1.py`'s (`+experiment=bench_w1`: tiny_qwen fp32, 8 x 8 sequences of 64
random prompt tokens and 64 forced new tokens). One process runs W1's real step loop (the halves
and the loop `locoexp.main` builds) with hooks that save a training-state checkpoint
(`RunCheckpoints`: parameters and AdamW state, orbax, asynchronous as in a run) after every
other step. After step 0 (compiles) the steps alternate: A, a step that starts while the
previous step's checkpoint is still written in the background (what a run saving every k steps
has after each k-th step), and B, a step with no save. Per save it records the seconds the loop
is blocked (`RunCheckpoints.save` returns once the arrays are off the devices); at the end it
times whole saves waited for on disk. Saving every 10 steps then costs (blocked + (A - B)) / 10
per step, which it prints against B (no saving).
"""

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench_w1 import W1, Records, build_w1_runner  # tools/ is on sys.path when run as a script

from locoexp.checkpoint.progress import RunProgress
from locoexp.checkpoint.state import RunCheckpoints
from locoexp.compose import compose_config
from locoexp.placement.inprocess import InProcess
from locoexp.placement.loop import StepLoop
from locoexp.session.build import build_spec


class AlternateSaves:
    """`SurvivalHooks` that save after every other step and time how long each save blocks."""

    def __init__(self, runner: InProcess, checkpoints: RunCheckpoints):
        self.runner, self.checkpoints = runner, checkpoints
        self.blocked_s: list[float] = []

    def stop_requested(self, step: int) -> None:
        return None

    def saves_after(self, updates: int) -> bool:
        return updates % 2 == 1  # after steps 0, 2, 4, ...: steps 1, 3, 5, ... are A

    def checkpoint(self, updates: int, clock, *, stopping: bool) -> None:
        progress = RunProgress(
            next_step=updates, seed=0, elapsed_s=clock.elapsed_s(), eval_total_s=0
        )
        start = time.perf_counter()
        self.runner.checkpoint(self.checkpoints, progress, wait=False)
        self.blocked_s.append(time.perf_counter() - start)

    def last_checkpoint(self) -> None:
        return None


def timed_saves(runner: InProcess, checkpoints: RunCheckpoints, *, repeats: int, first: int):
    """Seconds of whole saves (until on disk), one after another."""
    seconds = []
    for i in range(repeats):
        start = time.perf_counter()
        progress = RunProgress(next_step=first + i, seed=0, elapsed_s=0.0, eval_total_s=0.0)
        runner.checkpoint(checkpoints, progress, wait=True)
        seconds.append(time.perf_counter() - start)
    return seconds


def bench(pairs: int, directory: Path) -> dict:
    config = compose_config([*W1, "checkpoint_every_steps=0"])
    runner = build_w1_runner(config)
    steps = 1 + 2 * pairs
    plan = dataclasses.replace(
        build_spec(config).loop, steps=steps, eval_at_updates=(), eval_every_steps=0
    )
    checkpoints = RunCheckpoints(directory, max_to_keep=2)
    hooks = AlternateSaves(runner, checkpoints)
    sink = Records()
    timer, start = runner.rollout.timer, time.perf_counter()
    StepLoop(runner, plan, timer=timer, output=sink, start_time=start, hooks=hooks).run()
    checkpoints.wait()
    step_s = [r["timing/step_s"] for r in sink.steps]
    with_save, without = step_s[1::2], step_s[2::2]
    written = timed_saves(runner, checkpoints, repeats=2, first=steps + 1)
    checkpoints.close()
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()) / 2  # 2 kept
    blocked, a, b = (statistics.median(x) for x in (hooks.blocked_s[1:], with_save, without))
    return {
        "load_average": os.getloadavg(),
        "checkpoint_mb": size / 1e6,
        "save_blocked_s": hooks.blocked_s,
        "save_written_s": written,
        "step_s_save_in_flight": with_save,
        "step_s_no_save": without,
        "every_10_steps_overhead_s_per_step": (blocked + a - b) / 10,
        "every_10_steps_overhead_share": (blocked + a - b) / 10 / b,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2, help="(save in flight, no save) pairs")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        figures = bench(args.pairs, Path(directory))
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


if __name__ == "__main__":
    main()
