"""Workload W1 on this CPU: matmul roofline, rollout tokens/s, GRPO step by phase, start-up, memory.

    python tools/bench_w1.py [--steps 3] [--repeats 3] [--no-profile] [--loop-only] [--json PATH]
    python tools/bench_w1.py --loop-only adapter=lora adapter.rank=64 adapter.alpha=64  # an arm

W1 (issue 2): the Qwen3 architecture at `model=tiny_qwen` (V 151,936, D 256, F 768, 4 layers,
4 query / 2 KV heads, head_dim 64, tied embeddings, fp32, random init); 8 prompts x 8 samples of
64 random prompt tokens, 64 forced new tokens (`ignore_eos`), AdamW lr 1e-6, no KL. The workload
is the package's: `+experiment=bench_w1` (`dataset=random_tokens`), built by the package's
builders as a run builds it; this tool only measures it (the report: tools/w1_report.py).

Every figure is measured here, on this machine, in this process:
1. the matmul rate: fp32 matmuls (square, and shaped like the output head) under XLA and NumPy,
   median of timed repeats after warm-up; the best sustained rate is the roofline denominator;
   and the rate at each of the step's own matmul shapes (`tools/step_matmuls.py`, fastest of the
   timed calls: what the shape reaches when the machine lets it), from which
   every floor is also given as a shape floor: each matmul's FLOPs over its own shape's best
   rate, XLA timed with and without writing the product (the decode head [64,256]x[256,151936]
   is bandwidth-bound, a square matmul is not);
2. rollout: `JaxEngine.generate` on 64 sequences, median after compile, against its FLOPs;
3. the real step loop (`locoexp.placement.loop` over the halves `locoexp.placement.build` builds) by
   phase, medians over the steady window (`locoexp.metrics.steady`, as summary.json and the
   analysis), against the compute floor (rollout FLOPs + 3 x the trainer's forward FLOPs) /
   matmul rate;
4. time to first step (process start to the end of step 0, imports and compiles included) and
   peak RSS;
5. optionally (default on) a profile of where rollout and train time goes against each floor.

FLOPs count 2 per multiply-add of the matmuls a phase needs (`tools/step_matmuls.py`, the one
count: attention QK^T and PV over the causal/cached length included; norms, RoPE, softmax and
sampling excluded). The trainer runs the
body over all R x L row tokens but the output head only on the K loss positions, and that is what
its floor counts. The step engine's phases are timed in host clocks (`StepTimer`); every phase
ends with a host read of its results, so the clocks include device time.
"""

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from process_stats import cpu_seconds, load_averages, peak_rss_gb, process_age_s  # this folder
from step_matmuls import (  # this folder (a script's folder is on its path)
    measure_shapes,
    rollout_parts,
    shaped_floor_s,
    total_flops,
    train_parts,
)
from w1_report import print_report

from locoexp.compose import compose_config, use_cpu_backend
from locoexp.config import Config
from locoexp.dataset.schedule import build_schedule
from locoexp.metrics.steady import WARMUP_STEPS, steady_records, steady_window
from locoexp.metrics.timing import StepTimer
from locoexp.model.transformer import causal_segment_mask, init_cache
from locoexp.placement.build import build_checked_task, build_in_process
from locoexp.placement.halves import Published
from locoexp.placement.inprocess import InProcess
from locoexp.placement.loop import StepLoop
from locoexp.placement.multihost import HostGroup
from locoexp.placement.settings import LoopPlan
from locoexp.rollout.sampling import sample_tokens
from locoexp.session.build import build_spec

W1 = ["+experiment=bench_w1"]  # experiments/experiment/bench_w1.yaml
PHASES = ("admission", "generation", "reward", "pack", "train", "publish")


def time_repeats(fn: Callable[[], object], *, repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of `fn` (which must block until its result is ready), after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


# ---------------------------------------------------------------- matmul roofline


def matmul_rates(repeats: int) -> list[dict]:
    """fp32 GFLOP/s of a few matmuls under XLA (jit) and NumPy, median of `repeats`."""
    shapes = {
        "square 2048x2048x2048": (2048, 2048, 2048),
        "decode head [64,256]x[256,151936]": (64, 256, 151_936),
        "train head chunk [512,256]x[256,151936]": (512, 256, 151_936),
    }
    rng = np.random.default_rng(0)
    dot = jax.jit(jnp.dot)
    results = []
    for name, (m, k, n) in shapes.items():
        a = rng.standard_normal((m, k), np.float32)
        b = rng.standard_normal((k, n), np.float32)
        a_dev, b_dev = jnp.asarray(a), jnp.asarray(b)
        runs = {
            "xla": lambda a=a_dev, b=b_dev: dot(a, b).block_until_ready(),
            "numpy": lambda a=a, b=b: a @ b,
        }
        for backend, fn in runs.items():
            seconds = statistics.median(time_repeats(fn, repeats=repeats, warmup=2))
            results.append(
                {
                    "matmul": name,
                    "backend": backend,
                    "seconds": seconds,
                    "gflops": 2 * m * k * n / seconds / 1e9,
                }
            )
    return results


# ---------------------------------------------------------------- the W1 run


def build_w1_runner(config: Config) -> "CpuMarked":
    """The task, prompt order and in-process halves of W1 as a run builds them
    (`locoexp.session.build.build_spec`, `locoexp.placement.build`), marked with CPU seconds and
    process age at each step's start."""
    halves = build_spec(config).halves
    task = build_checked_task(halves.model, halves.dataset)
    schedule = build_schedule(halves.dataset, steps=config.steps, num_examples=len(task.train))
    runner = build_in_process(halves, task, schedule, HostGroup.current(), StepTimer())
    return CpuMarked(rollout=runner.rollout, trainer=runner.trainer, group=runner.group)


@dataclasses.dataclass(kw_only=True)
class CpuMarked(InProcess):
    """The in-process transport, noting CPU seconds and process age when each step starts."""

    marks: list[tuple[float, float]] = dataclasses.field(default_factory=list)

    def start_rollout(self, step: int, published: Published):
        self.marks.append((cpu_seconds(), process_age_s()))
        return super().start_rollout(step, published)


class Records:
    """The loop's record sink: keeps every step record (the evaluation is not timed)."""

    def __init__(self):
        self.steps: list[dict] = []

    def export(self, record: dict) -> None:
        self.steps.append(record)

    def on_eval(self, checkpoint, *, seconds: float) -> None:
        pass


def run_steps(runner: CpuMarked, plan: LoopPlan, steps: int) -> tuple[float, list[dict]]:
    """The warm-up steps (`metrics.steady`: they compile) then `steps` steady steps, by the one
    step loop (O2 as configured). Returns the process age at the end of step 0 and every step's
    record."""
    plan = dataclasses.replace(
        plan, steps=WARMUP_STEPS + steps, eval_at_updates=(), eval_every_steps=0
    )
    sink, timer = Records(), runner.rollout.timer
    StepLoop(runner, plan, timer=timer, output=sink, start_time=time.perf_counter()).run()
    runner.marks.append((cpu_seconds(), process_age_s()))  # the end (after the final flush)
    cpu = [b[0] - a[0] for a, b in zip(runner.marks, runner.marks[1:], strict=False)]
    records = [{**r, "cpu_s": c} for r, c in zip(sink.steps, cpu, strict=True)]
    return runner.marks[1][1], records


def step_timings(records: list[dict]) -> dict:
    """Medians over the steady window (`locoexp.metrics.steady`) of the loop's own clocks."""
    steady = steady_records(records, steady_window(steps=len(records)))
    return {
        "phases_s": {p: statistics.median(r[f"timing/{p}_s"] for r in steady) for p in PHASES},
        "step_s": statistics.median(r["timing/step_s"] for r in steady),
        "unaccounted_s": statistics.median(r["timing/unaccounted_s"] for r in steady),
        "cpu_s": statistics.median(r["cpu_s"] for r in steady),
        "step_decode_s_per_iteration": statistics.median(
            1e-3 * r["rollout/decode_ms_per_iteration"] for r in steady
        ),
        "steady_steps": len(steady),
        "reward_mean": [r["rollout/reward_mean"] for r in records],
        "first_step_record": records[0],
    }


# ---------------------------------------------------------------- profile


def profile_rollout(runner: CpuMarked, prompts: list[np.ndarray], repeats: int) -> dict[str, float]:
    """The engine's compiled program alone, and one decode iteration's parts in isolation."""
    engine = runner.rollout.engine
    m = engine.model_config
    n, p = len(prompts), len(prompts[0])
    new, sampling = runner.rollout.settings.max_new_tokens, runner.rollout.settings.sampling
    # one static wave's programs, as generate() runs them
    start, run, requests = engine.wave_programs(prompts, max_new_tokens=new, sampling=sampling)
    tokens = jax.device_put(requests.prompts)
    key = jax.random.key(1)

    def program():
        return run(engine.params, start(engine.params, requests, key), requests)

    out = {
        "program_s": statistics.median(
            time_repeats(lambda: jax.block_until_ready(program()), repeats=repeats)
        )
    }

    graphdef, params, slots = engine.graphdef, engine.params, p + new
    cache = init_cache(m, n, slots)
    mask1 = jnp.ones((n, slots), bool)  # with a cache: the slots holding real tokens
    pos1, tok1 = jnp.full((n, 1), p + 32, jnp.int32), jnp.ones((n, 1), jnp.int32)

    @jax.jit
    def body_step(params, tok, pos, mask, cache):
        return nnx.merge(graphdef, params)(tok, pos, mask, cache, p + 32)

    @jax.jit
    def head(params, hidden):
        return nnx.merge(graphdef, params).logits(hidden)

    @jax.jit
    def head_sample(params, hidden, key):
        return sample_tokens(key, nnx.merge(graphdef, params).logits(hidden), temperature=1.0)

    @jax.jit
    def prefill(params, tokens, cache):
        model = nnx.merge(graphdef, params)
        positions = jnp.broadcast_to(jnp.arange(p), (n, p))
        hidden, cache = model(tokens, positions, jnp.ones((n, slots), bool), cache, 0)
        return model.logits(hidden[:, -1]), cache

    hidden = jax.random.normal(jax.random.key(2), (n, m.hidden_dim))
    runs = {
        "decode_body_s": lambda: body_step(params, tok1, pos1, mask1, cache),
        "decode_head_s": lambda: head(params, hidden),
        "decode_head_sample_s": lambda: head_sample(params, hidden, key),
        "prefill_s": lambda: prefill(params, tokens, cache),
    }
    for name, fn in runs.items():
        out[name] = statistics.median(
            time_repeats(lambda fn=fn: jax.block_until_ready(fn()), repeats=5 * repeats, warmup=2)
        )
    return out


def profile_train(runner: CpuMarked, repeats: int) -> dict[str, float]:
    """The train step alone on a real packed batch, its forward alone, and the body alone."""
    half, trainer = runner.trainer, runner.trainer.trainer
    with runner.rollout.timer.step():  # the halves time their phases inside a step
        part = runner.rollout.run(0, Published(trainer.steps_done))
        batch, _ = half.pack([part], carried=None)
    placed = trainer.device_batch(batch)
    graphdef = trainer.graphdef

    @jax.jit
    def body_forward(params, b):
        model = nnx.merge(graphdef, params)
        return model(b.tokens, b.positions, causal_segment_mask(b.segment_ids))[0]

    runs = {
        "train_step_s": lambda: trainer.train_step(batch),
        "forward_logprobs_s": lambda: trainer._logprobs(trainer.trainable, trainer.frozen, placed),
        "forward_body_s": lambda: body_forward(trainer.params, placed),
    }
    return {
        name: statistics.median(
            time_repeats(lambda fn=fn: jax.block_until_ready(fn()), repeats=repeats)
        )
        for name, fn in runs.items()
    }


# ---------------------------------------------------------------- figures


def bench_rollout(runner: CpuMarked, prompts: list[np.ndarray], repeats: int) -> dict[str, float]:
    """`JaxEngine.generate` wall seconds (median after the compile of the first call)."""
    s, results = runner.rollout.settings, []

    def once():
        results.append(
            runner.rollout.engine.generate(
                prompts,
                key=jax.random.key(len(results)),
                max_new_tokens=s.max_new_tokens,
                sampling=s.sampling,
            )
        )

    seconds = statistics.median(time_repeats(once, repeats=repeats))
    rollout, timed = results[-1], results[1:]  # the first call compiled
    assert (rollout.lengths == s.max_new_tokens).all(), "ignore_eos must force every completion"
    return {
        "seconds": seconds,
        "tokens": int(rollout.lengths.sum()),
        "decode_iterations": rollout.decode_iterations,
        "engine_prefill_s": statistics.median(r.prefill_s for r in timed),
        "engine_decode_s_per_iteration": statistics.median(r.decode_s_per_iteration for r in timed),
    }


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def w1_parts(config: Config, runner: CpuMarked, rows: int) -> dict[str, list]:
    """W1's step parts as matmul terms at their own shapes (`tools/step_matmuls.py`)."""
    m, d = config.model, config.dataset
    n = d.prompts_per_step * d.samples_per_prompt
    rollout = rollout_parts(m, sequences=n, prompt=d.max_prompt_tokens, new=d.max_new_tokens)
    train = train_parts(
        m,
        rows=rows,
        row_tokens=runner.rollout.settings.row_tokens,
        sequences=n,
        sequence_tokens=d.max_prompt_tokens + d.max_new_tokens,
        slots=n * d.max_new_tokens,
        chunk=runner.trainer.trainer.config.logit_chunk_tokens,
    )
    return {**rollout, **train}


def shape_table(parts: dict[str, list], shaped: dict, roofline_gflops: float) -> list[dict]:
    """Every distinct matmul shape of the step: who uses it, the rates and the FLOPs there."""
    users = ("prefill", "decode", "forward", "backward")
    table = []
    for shape, rate in shaped.items():
        used = [p for p in users if any(s == shape for s, _ in parts[p])]
        flops = sum(f for p in ("rollout", "train_step") for s, f in parts[p] if s == shape)
        table.append(
            {
                **rate,
                "used_by": used,
                "step_flops": flops,
                "of_roofline": rate["gflops"] / roofline_gflops,
            }
        )
    return table


def summarise(
    config: Config, runner: CpuMarked, records: list[dict], rollout: dict, rates: list[dict],
    shaped: dict,
) -> dict:  # fmt: skip
    """The report's figures: rollout and step against the square roofline and the shape floor
    (FLOPs of `tools/step_matmuls.py`'s terms)."""
    best = max(rates, key=lambda r: r["gflops"])
    parts, rates_at = shaped["parts"], shaped["rates"]
    r_flops = {k: total_flops(parts[p]) for k, p in
               (("prefill", "prefill"), ("decode", "decode"), ("total", "rollout"))}  # fmt: skip
    t_flops = {k: total_flops(parts[k]) for k in ("forward_body", "forward_head")}
    t_flops["total"] = total_flops(parts["train_step"])
    rate = best["gflops"] * 1e9
    timings = step_timings(records)
    step_s = timings["step_s"]
    floor_s = (r_flops["total"] + t_flops["total"]) / rate
    shape_floor_s = shaped_floor_s(parts["rollout"] + parts["train_step"], rates_at)
    rollout_shape_floor_s = shaped_floor_s(parts["rollout"], rates_at)
    return dict(
        matmul=rates,
        roofline_gflops=best["gflops"],
        roofline_source=f"{best['matmul']} ({best['backend']})",
        shapes=shape_table(parts, rates_at, best["gflops"]),
        rollout={
            **rollout,
            "tokens_per_s": rollout["tokens"] / rollout["seconds"],
            "s_per_decode_iteration": rollout["seconds"] / rollout["decode_iterations"],
            "flops": r_flops,
            "roofline_fraction": r_flops["total"] / rollout["seconds"] / rate,
            "shape_floor_s": rollout_shape_floor_s,
            "shape_floor_fraction": rollout_shape_floor_s / rollout["seconds"],
        },
        step={
            **timings,
            "rollout_flops": r_flops["total"],
            "train_flops": t_flops,
            "rows": int(records[-1]["train/rows"]),
            "floor_s": floor_s,
            "step_over_floor": step_s / floor_s,
            "shape_floor_s": shape_floor_s,
            "train_shape_floor_s": shaped_floor_s(parts["train_step"], rates_at),
            "step_over_shape_floor": step_s / shape_floor_s,
        },
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed GRPO steps after step 0")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement")
    parser.add_argument("--no-profile", action="store_true", help="skip the per-part profile")
    parser.add_argument(
        "--loop-only",
        action="store_true",
        help="only the step loop: step and phase medians, first step, peak RSS (A/B arms such "
        "as adapter=lora against full fine-tuning, one process each)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides of W1 (A/B runs)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    report: dict = {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "load_start": os.getloadavg()}
    print(
        f"W1 benchmark, CPU figures ({report['cpus']} CPUs, {report['cpu_model']}, "
        f"{jax.devices()[0].platform}, jax {jax.__version__}); {load_averages()}",
        flush=True,
    )
    overrides = [*W1, *args.overrides]
    report["overrides"] = overrides
    config = compose_config(overrides)
    m, d = config.model, config.dataset
    runner = build_w1_runner(config)
    first_step_s, records = run_steps(runner, build_spec(config).loop, args.steps)
    rss_run = peak_rss_gb()
    if args.loop_only:
        report_loop(report, records, first_step_s=first_step_s, rss_gb=rss_run)
        return write_json(report, args.json)
    n, train = d.prompts_per_step * d.samples_per_prompt, runner.rollout.task.train
    prompts = [train[i % len(train)].prompt_tokens for i in range(n)]  # W1's own prompts
    rollout = bench_rollout(runner, prompts, args.repeats)
    rates = matmul_rates(args.repeats)
    parts = w1_parts(config, runner, rows=int(records[-1]["train/rows"]))
    shaped = {"parts": parts, "rates": measure_shapes(parts.values(), args.repeats)}
    report.update(summarise(config, runner, records, rollout, rates, shaped))
    report.update(first_step_s=first_step_s, peak_rss_gb_run=rss_run)
    print_report(report, m)
    if not args.no_profile:
        rate = report["roofline_gflops"] * 1e9
        report["profile"] = run_profile(runner, prompts, args.repeats, rate, shaped)
    report["peak_rss_gb_end"] = peak_rss_gb()
    report["load_end"] = os.getloadavg()
    print(
        f"\n{load_averages()} (end); peak RSS at the end of the script "
        f"{report['peak_rss_gb_end']:.2f} GB"
    )
    return write_json(report, args.json)


def write_json(report: dict, path: Path | None) -> dict:
    if path:
        path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {path}")
    return report


def report_loop(report: dict, records: list[dict], *, first_step_s: float, rss_gb: float) -> dict:
    """`--loop-only`: print the steady window's step and phase medians, the process age at the
    end of step 0 and the peak RSS after the loop, with the load averages."""
    timings = step_timings(records)
    report.update(first_step_s=first_step_s, peak_rss_gb_run=rss_gb, steps=timings)
    phases = ", ".join(f"{p} {s:.2f}" for p, s in timings["phases_s"].items())
    print(
        f"step {timings['step_s']:.2f} s (median of {timings['steady_steps']} steady steps; "
        f"CPU {timings['cpu_s']:.2f} s per step; {phases}); first step ends at "
        f"{first_step_s:.1f} s; peak RSS {rss_gb:.2f} GB; {load_averages()} (end)"
    )
    return report


def run_profile(
    runner: CpuMarked, prompts: list[np.ndarray], repeats: int, rate: float, shaped: dict
) -> dict:
    """Each part's time next to its floors: FLOPs / roofline rate, and the shape floor."""
    new = runner.rollout.settings.max_new_tokens
    ro = profile_rollout(runner, prompts, repeats)
    tr = profile_train(runner, repeats)
    lines = [  # (part, seconds, its matmul terms in tools/step_matmuls.py)
        ("rollout: compiled program alone", ro["program_s"], "rollout"),
        ("  prefill (64x64 tokens + head on last)", ro["prefill_s"], "prefill"),
        ("  decode: body, one token, 64 rows", ro["decode_body_s"], "decode_body_once"),
        ("  decode: head [64,256]x[256,V]", ro["decode_head_s"], "decode_head_once"),
        ("  decode: head + sampling", ro["decode_head_sample_s"], "decode_head_once"),
        (
            "  decode: parts x (M-1) iterations",
            (new - 1) * (ro["decode_body_s"] + ro["decode_head_sample_s"]),
            "decode",
        ),
        ("train: step alone (fwd + bwd + AdamW)", tr["train_step_s"], "train_step"),
        ("  forward (logprobs on K positions)", tr["forward_logprobs_s"], "forward"),
        ("  forward body only (R x L tokens)", tr["forward_body_s"], "forward_body"),
        (
            "  forward head only (difference)",
            tr["forward_logprobs_s"] - tr["forward_body_s"],
            "forward_head",
        ),
        (
            "  backward + AdamW (difference)",
            tr["train_step_s"] - tr["forward_logprobs_s"],
            "backward",
        ),
    ]
    print("\n6. Profile (each part alone, median; floor = FLOPs / roofline rate; shape floor =")
    print("   each matmul's FLOPs / the best rate at its own shape):")
    print(
        f"  {'part':<42} {'seconds':>9} {'floor s':>9} {'x floor':>8} {'shape s':>9} {'x shape':>8}"
    )
    table = []
    for name, seconds, key in lines:
        floor = total_flops(shaped["parts"][key]) / rate
        shape_floor = shaped_floor_s(shaped["parts"][key], shaped["rates"])
        print(
            f"  {name:<42} {seconds:9.3f} {floor:9.3f} {seconds / floor:8.2f} "
            f"{shape_floor:9.3f} {seconds / shape_floor:8.2f}"
        )
        table.append(
            {
                "part": name.strip(),
                "seconds": seconds,
                "floor_s": floor,
                "shape_floor_s": shape_floor,
            }
        )
    return {**ro, **tr, "lines": table}


if __name__ == "__main__":
    use_cpu_backend()  # CPU figures: JAX would try libtpu first where it is installed
    main()
