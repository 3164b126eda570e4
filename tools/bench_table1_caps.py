"""Table 1's GSM8K step at the paper's caps on this machine: step time, phases, peak RSS, floor.

    python tools/bench_table1_caps.py [--steps 2] [--repeats 5] [--json PATH] [OVERRIDE ...]

Issue 11's "must show": `model=tiny_qwen dataset=gsm8k` at Table 1's caps (512 prompt / 2,048
new tokens, forced: `rollout.ignore_eos=true`), 2 prompts x 4 samples, run as a user runs it
(`python run.py ...` in a child process, `logger=none`, the local GSM8K rows under
../shared/data/gsm8k). Extra Hydra overrides (e.g. `trainer.micro_batch_rows=8`) go after the
flags. It reports:

1. the run's records (metrics.jsonl): step time and its generation / train split, per step;
2. the run's peak RSS: the child's maximum resident set (`getrusage(RUSAGE_CHILDREN)`, which
   covers the largest waited-for descendant; `co` runs in that one process);
3. the train phase's floor: the FLOPs of its forward + backward at the step's own shapes (the
   body over R packed rows x L tokens, causal attention within each packed sequence, the fused
   output head over the K loss slots in chunks of C; `tools/step_matmuls.py`) divided, matmul by
   matmul, by the best rate XLA or NumPy reaches at that matmul's shape here, measured in this
   process after the run (so the run and the rates see the same machine); next to it the
   floor at the best square-matmul rate. Attention counts the causal half at each sequence's
   real length (prompt + forced 2,048 new tokens), as the trainer's blockwise kernel computes
   (it skips blocks above the diagonal but not the masked half of diagonal blocks: a few %).

4. the same ratio measured so that a drifting machine moves it less: the train step alone, in
   this process, at the run's shapes (its trainer settings as the plan resolved them, the run's
   mean prompt length, random tokens), `--rounds` times, each between two measurements of its
   floor's matmul rates (floor, step, floor, step, ..., floor); each round's step over the mean
   of the floors on either side of it (a drift that is linear over the round cancels), and
   their median. This machine's speed moves by more than 1.3x over tens of minutes
   (experiments/LOG.md, sessions 6-8), so the run's ratio (step 1-2 against a floor measured
   minutes later) is reported but not trusted alone.

CPU figures only.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh
from step_matmuls import (  # this folder (a script's folder is on its path)
    Shape,
    measure_shape,
    measure_shapes,
    shaped_floor_s,
    total_flops,
    train_parts,
)

from locoexp.compose import compose_config
from locoexp.metrics.steady import steady_records, steady_window
from locoexp.model.checkpoint import load_model
from locoexp.planner.plan import trainer_row_tokens
from locoexp.session.build import build_spec
from locoexp.trainer.packing import pack_sequences
from locoexp.trainer.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
TABLE1_CAPS = [
    "model=tiny_qwen",
    "dataset=gsm8k",
    f"dataset.data_files={GSM8K / 'train.jsonl'}",
    "dataset.eval_data_files=null",
    "dataset.max_prompt_tokens=512",
    "dataset.max_new_tokens=2048",
    "rollout.ignore_eos=true",
    "dataset.prompts_per_step=2",
    "dataset.samples_per_prompt=4",
    "eval_every_steps=0",
    "logger=none",
]
SQUARE = Shape(2048, 2048, 2048)
TARGETS = {"peak_rss_gb_max": 4.0, "train_over_floor_max": 1.3}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def run_workload(overrides: list[str], run_dir: Path) -> dict:
    """`python run.py` with Table 1's caps; its records, wall time and peak RSS."""
    command = [sys.executable, "run.py", *overrides, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"run.py failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if after.ru_maxrss <= before.ru_maxrss:
        sys.exit("peak RSS not measurable: an earlier child of this process was larger")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return {
        "records": [r for r in records if "timing/step_s" in r],
        "peak_rss_gb": after.ru_maxrss * 1024 / 1e9,  # ru_maxrss is in KiB on Linux
        "wall_s": wall,
        "cpu_s": cpu,
    }


def train_terms(config, *, rows: int, prompt_tokens: int):
    """The train step's matmul terms at the run's shapes: `rows` packed rows, sequences of
    `prompt_tokens` plus the forced new tokens, the head over every new token."""
    d = config.dataset
    n = d.prompts_per_step * d.samples_per_prompt
    return train_parts(
        config.model,
        rows=rows,
        row_tokens=trainer_row_tokens(d, config.trainer),
        sequences=n,
        sequence_tokens=prompt_tokens + d.max_new_tokens,
        slots=n * d.max_new_tokens,
        chunk=config.trainer.logit_chunk_tokens,
    )["train_step"]


def train_floor(overrides: list[str], record: dict, repeats: int) -> dict:
    """The train step's FLOPs at its own shapes over the rates measured at those shapes."""
    config = compose_config(overrides)
    prompt = round(record["rollout/prompt_tokens_mean"])
    terms = train_terms(config, rows=int(record["train/rows"]), prompt_tokens=prompt)
    rates = measure_shapes([terms], repeats)
    square = measure_shape(SQUARE, repeats)
    flops = total_flops(terms)
    used = [{**r, "step_flops": sum(f for s, f in terms if s == k)} for k, r in rates.items()]
    return {
        "flops": flops,
        "floor_s": shaped_floor_s(terms, rates),
        "square_floor_s": flops / (square["gflops"] * 1e9),
        "square": square,
        "rates": used,
    }


def standalone_batch(config, prompt_tokens: int, row_tokens: int):
    """The run's train batch shapes: its sequences at its mean prompt length plus the forced
    new tokens, random tokens, packed as the run packs them."""
    d, vocab = config.dataset, config.model.vocab_size
    n, new = d.prompts_per_step * d.samples_per_prompt, d.max_new_tokens
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, vocab, prompt_tokens).astype(np.int32) for _ in range(n)]
    completions = [rng.integers(1, vocab, new).astype(np.int32) for _ in range(n)]
    behaviour = [np.full(new, -1.0, np.float32)] * n
    advantages = np.linspace(-1, 1, n).astype(np.float32)
    return pack_sequences(prompts, completions, behaviour, advantages, row_tokens=row_tokens)


def interleaved_ratio(overrides: list[str], record: dict, rounds: int, repeats: int) -> dict:
    """The train step alone, each time between two measurements of its floor; round by round."""
    config = compose_config(overrides)
    halves = build_spec(config).halves  # micro_batch_rows as the plan resolves it
    d, t = halves.dataset, halves.trainer
    prompt = round(record["rollout/prompt_tokens_mean"])
    batch = standalone_batch(config, prompt, trainer_row_tokens(d, t))
    trainer = Trainer(
        load_model(config.model, seed=config.seed),
        config.algo,
        t,
        mesh=Mesh(np.array(jax.devices()[:1]), ("fsdp",)),
        temperature=config.rollout.temperature,
        max_new_tokens=d.max_new_tokens,
    )
    terms = train_terms(config, rows=batch.rows, prompt_tokens=prompt)
    trainer.train_step(batch)  # compiles
    floor_of = lambda: shaped_floor_s(terms, measure_shapes([terms], repeats))  # noqa: E731
    floors, out = [floor_of()], []
    for _ in range(rounds):  # floor, step, floor, step, ..., floor
        start = time.perf_counter()
        trainer.train_step(batch)
        step = time.perf_counter() - start
        floors.append(floor_of())
        floor = (floors[-2] + floors[-1]) / 2  # the floors on either side: a linear drift cancels
        out.append({"step_s": step, "floor_s": floor, "ratio": step / floor})
    return {
        "micro_batch_rows": t.micro_batch_rows,
        "rows": batch.rows,
        "rounds": out,
        "median_ratio": statistics.median(r["ratio"] for r in out),
    }


def summarise(run: dict, floor: dict) -> dict:
    steps = run["records"]
    timed = steady_records(steps, steady_window(steps=len(steps)))  # warm-up compiles
    median = {
        k: statistics.median(r[f"timing/{k}_s"] for r in timed)
        for k in ("step", "generation", "train")
    }
    return {
        "per_step": [
            {k: r[f"timing/{k}_s"] for k in ("step", "generation", "train")} for r in steps
        ],
        "median_steady": median,
        "train_over_floor": median["train"] / floor["floor_s"],
        "train_over_square_floor": median["train"] / floor["square_floor_s"],
    }


def print_report(report: dict) -> None:
    print(f"\n{report['machine']}\noverrides: {' '.join(report['overrides'])}")
    for i, s in enumerate(report["summary"]["per_step"]):
        print(
            f"  step {i}: {s['step']:7.1f} s = generation {s['generation']:6.1f} s + train "
            f"{s['train']:6.1f} s (+ the rest)" + ("  (compiles)" if i == 0 else "")
        )
    f, s = report["floor"], report["summary"]
    print(
        f"  peak RSS of the run: {report['peak_rss_gb']:.2f} GB; the run took "
        f"{report['run_wall_s']:.0f} s and {report['run_cpu_s']:.0f} CPU s (imports and compiles "
        f"included): {report['run_cpu_s'] / report['run_wall_s']:.2f} cores on average of "
        f"{os.cpu_count()} (less = other processes took the rest)"
    )
    print(f"\n  train step {f['flops'] / 1e12:.2f} TFLOP at its own shapes:")
    for r in sorted(f["rates"], key=lambda r: -r["step_flops"]):
        print(
            f"    {r['shape']:<34} {r['step_flops'] / 1e9:8.1f} GFLOP at {r['gflops']:6.1f} "
            f"GFLOP/s ({r['best']}) = {r['step_flops'] / r['gflops'] / 1e9:6.2f} s"
        )
    print(
        f"  floor at the step's shapes {f['floor_s']:.1f} s; at the square-matmul rate "
        f"({f['square']['gflops']:.1f} GFLOP/s, {f['square']['shape']}) {f['square_floor_s']:.1f} s"
    )
    train = s["median_steady"]["train"]
    print(
        f"  the run: train {train:.1f} s / floor {f['floor_s']:.1f} s (measured after it) = "
        f"{s['train_over_floor']:.2f}x; peak RSS {report['peak_rss_gb']:.2f} GB "
        f"(target < {TARGETS['peak_rss_gb_max']})"
    )
    i = report.get("interleaved")
    if i:
        rounds = ", ".join(
            f"{r['step_s']:.1f} / {r['floor_s']:.1f} = {r['ratio']:.2f}x" for r in i["rounds"]
        )
        print(
            f"  the train step alone ({i['rows']} rows, micro-batches of "
            f"{i['micro_batch_rows']}), each round's step / the mean of the floors measured "
            f"before and after it: {rounds}; median "
            f"{i['median_ratio']:.2f}x (target <= {TARGETS['train_over_floor_max']})"
        )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per matmul shape")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--rounds", type=int, default=3, help="standalone step / floor rounds (0: none)"
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for run.py")
    args = parser.parse_args(argv)
    overrides = [*TABLE1_CAPS, f"steps={args.steps}", *args.overrides]
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        run = run_workload(overrides, Path(folder) / "run")
    floor = train_floor(overrides, run["records"][-1], args.repeats)
    report = {
        "machine": f"{cpu_model()}, {os.cpu_count()} CPUs; load average at start "
        f"{load_start[0]:.1f}, at end {os.getloadavg()[0]:.1f} (CPU figures)",
        "overrides": overrides,
        "peak_rss_gb": run["peak_rss_gb"],
        "run_wall_s": run["wall_s"],
        "run_cpu_s": run["cpu_s"],
        "floor": floor,
        "summary": summarise(run, floor),
    }
    if args.rounds:
        record = run["records"][-1]
        report["interleaved"] = interleaved_ratio(overrides, record, args.rounds, args.repeats)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
