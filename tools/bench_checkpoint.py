"""Checkpoint cost on W1: seconds per save, and step time with a save every 10 steps against none.

    python tools/bench_checkpoint.py [--blocks 2] [--json PATH]

W1 (tools/bench_w1.py): `model=tiny_qwen` (V 151,936, D 256, 4 layers, fp32), 8 prompts x 8
samples, 64 prompt and 64 forced new tokens. A checkpoint holds the parameters and both AdamW
moments (3 x 40.6 M fp32 values). Measured in one process on one W1 runner:
1. a save: the blocking part (`RunCheckpoints.save` returning: the arrays copied off the
   devices) and the whole save (`wait=True`: files on disk), median of 3;
2. step time: blocks of 10 steps, alternating "no save" and "one asynchronous save before the
   block" (the `checkpoint_every_steps=10` pattern: the write overlaps the next steps), the
   order interleaved so that machine load hits both arms alike.
"""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

from bench_w1 import build_w1_runner, compose_w1, load_averages  # noqa: E402

from locoexp.checkpoint.state import RunCheckpoints, RunProgress  # noqa: E402


def timed_steps(runner, first: int, count: int) -> list[float]:
    times = []
    for step in range(first, first + count):
        with runner.timer.step():
            runner.step(step)
        times.append(runner.timer.metrics()["timing/step_s"])
    return times


def save(checkpoints: RunCheckpoints, runner, step: int, *, wait: bool) -> float:
    start = time.perf_counter()
    progress = RunProgress(next_step=step, seed=0, elapsed_s=0.0, eval_total_s=0.0)
    checkpoints.save(progress, runner.trainer.state(), wait=wait)
    return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=2, help="blocks of 10 steps per arm")
    parser.add_argument("--block-steps", type=int, default=10, help="steps per block (period)")
    parser.add_argument("--full-saves", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    runner = build_w1_runner(compose_w1())
    directory = Path(tempfile.mkdtemp(prefix="bench_checkpoint_"))
    checkpoints = RunCheckpoints(directory, max_to_keep=2)
    try:
        timed_steps(runner, 0, 1)  # compiles
        full = [save(checkpoints, runner, 100 + i, wait=True) for i in range(args.full_saves)]
        step, arms = 1, {"none": [], "every_10": []}
        blocking = []
        for block in range(2 * args.blocks):
            arm = "none" if block % 2 == 0 else "every_10"
            if arm == "every_10":
                blocking.append(save(checkpoints, runner, 200 + block, wait=False))
            arms[arm] += timed_steps(runner, step, args.block_steps)
            step += args.block_steps
        checkpoints.wait()
        result = {
            "save_full_s": statistics.median(full),
            "save_blocking_s": statistics.median(blocking),
            "step_s_none": statistics.mean(arms["none"]),
            "step_s_every_10": statistics.mean(arms["every_10"]),
            "load_averages": load_averages(),
            "checkpoint_bytes": sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
            / len([p for p in (directory / "checkpoints").iterdir() if p.name.isdigit()]),
        }
        # per step of a 10-step period: the save's blocking part plus any slowdown of the steps
        result["overhead_per_step_s"] = (
            result["step_s_every_10"]
            - result["step_s_none"]
            + result["save_blocking_s"] / args.block_steps
        )
        result["block_steps"] = args.block_steps
    finally:
        checkpoints.close()
        shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
