"""Workload W1 on this CPU: matmul roofline, rollout tokens/s, GRPO step by phase, start-up, memory.

    python tools/bench_w1.py [--steps 3] [--repeats 3] [--no-profile] [--json PATH]

W1 (issue 2): the Qwen3 architecture at `model=tiny_qwen` (V 151,936, D 256, F 768, 4 layers,
4 query / 2 KV heads, head_dim 64, tied embeddings, fp32, random init); 8 prompts x 8 samples of
64 random prompt tokens, 64 forced new tokens (`ignore_eos`), AdamW lr 1e-6, no KL.

Every figure is measured here, on this machine, in this process:
1. the matmul rate: fp32 matmuls (square, and shaped like the output head) under XLA and NumPy,
   median of timed repeats after warm-up; the best sustained rate is the roofline denominator;
   and the rate at each of the step's own matmul shapes (`tools/step_matmuls.py`, fastest of the
   timed calls: what the shape reaches when the machine lets it), from which
   every floor is also given as a shape floor: each matmul's FLOPs over its own shape's best
   rate, XLA timed with and without writing the product (the decode head [64,256]x[256,151936]
   is bandwidth-bound, a square matmul is not);
2. rollout: `JaxEngine.generate` on 64 sequences, median after compile, against its FLOPs;
3. the real step loop (`locoexp.placement.loop` over the halves `locoexp.main` builds) by
   phase, against the compute floor (rollout FLOPs + 3 x the trainer's forward FLOPs) / matmul rate;
4. time to first step (process start to the end of step 0, imports and compiles included) and
   peak RSS;
5. optionally (default on) a profile of where rollout and train time goes against each floor.

FLOPs count 2 per multiply-add of the matmuls a phase needs (attention QK^T and PV over the
causal/cached length included; norms, RoPE, softmax and sampling excluded). The trainer runs the
body over all R x L row tokens but the output head only on the K loss positions, and that is what
its floor counts. The step engine's phases are timed in host clocks (`StepTimer`); every phase
ends with a host read of its results, so the clocks include device time.
"""

import argparse
import dataclasses
import json
import os
import resource
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from step_matmuls import (  # this folder (a script's folder is on its path)
    measure_shapes,
    rollout_parts,
    shaped_floor_s,
    total_flops,
    train_parts,
)

from locoexp.compose import compose_config
from locoexp.config import Config
from locoexp.dataset.schedule import PromptSchedule
from locoexp.dataset.task import Example
from locoexp.main import build_in_process, build_loop_plan
from locoexp.metrics.timing import StepTimer
from locoexp.model.config import ModelConfig
from locoexp.model.transformer import causal_segment_mask, init_cache
from locoexp.placement.halves import Published
from locoexp.placement.inprocess import InProcess
from locoexp.placement.loop import LoopPlan, StepLoop
from locoexp.placement.multihost import HostGroup
from locoexp.rollout.sampling import sample_tokens

W1 = ["+experiment=bench_w1"]  # experiments/experiment/bench_w1.yaml
PHASES = ("admission", "generation", "reward", "pack", "train", "publish")
TARGETS = {
    "rollout_roofline_min": 0.70,
    "step_over_floor_max": 1.5,
    "first_step_s_max": 30.0,
    "peak_rss_gb_max": 3.0,
}


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc; includes interpreter start and imports)."""
    start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KB on Linux


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (against wall time: the cores it really got)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def load_averages() -> str:
    return "load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


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


# ---------------------------------------------------------------- FLOPs (2 per multiply-add)


def body_params(m: ModelConfig) -> int:
    """Matmul weights of the blocks (attention projections and SwiGLU), per token touched once."""
    attn = m.hidden_dim * m.head_dim * (2 * m.num_heads + 2 * m.num_kv_heads)
    return m.num_layers * (attn + 3 * m.hidden_dim * m.mlp_dim)


def head_params(m: ModelConfig) -> int:
    return m.hidden_dim * m.vocab_size


def attention_flops(m: ModelConfig, context: int) -> int:
    """QK^T and PV of one query token over `context` keys, all layers."""
    return m.num_layers * 2 * 2 * m.num_heads * m.head_dim * context


def rollout_flops(m: ModelConfig, *, sequences: int, prompt: int, new: int) -> dict[str, float]:
    """Prefill (body on P tokens, head on the last) and decode (body + head on each of M - 1
    further tokens, attending over the cache filled so far)."""
    prefill = 2 * prompt * body_params(m) + 2 * head_params(m)
    prefill += sum(attention_flops(m, i + 1) for i in range(prompt))
    decode = sum(
        2 * (body_params(m) + head_params(m)) + attention_flops(m, prompt + t + 1)
        for t in range(new - 1)
    )
    return {
        "prefill": sequences * prefill,
        "decode": sequences * decode,
        "total": sequences * (prefill + decode),
    }


def train_flops(
    m: ModelConfig,
    *,
    rows: int,
    row_tokens: int,
    sequence_tokens: int,
    sequences: int,
    loss_slots: int,
) -> dict[str, float]:
    """3 x forward: body over R x L row tokens, causal attention within each packed sequence,
    output head on the K loss positions only (the trainer's chunked head)."""
    body = 2 * rows * row_tokens * body_params(m)
    body += sequences * sum(attention_flops(m, i + 1) for i in range(sequence_tokens))
    head = 2 * loss_slots * head_params(m)
    return {"forward_body": body, "forward_head": head, "total": 3 * (body + head)}


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


# ---------------------------------------------------------------- W1 runtime objects


@dataclasses.dataclass(frozen=True)
class IdTokenizer:
    """Token ids as text; W1 prompts are random ids, never rendered."""

    vocab_size: int
    eos_id: int = 1
    pad_id: int = 0

    def encode(self, text: str) -> list[int]:
        return [int(word) for word in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(str(int(i)) for i in ids)


class RandomPromptTask:
    """W1's task: prompts of random ids; reward = share of even ids in the completion, a
    deterministic function that differs between samples, so group advantages are non-zero."""

    def __init__(self, *, vocab_size: int, prompt_tokens: int, num_prompts: int, seed: int):
        self.tokenizer = IdTokenizer(vocab_size)
        rng = np.random.default_rng(seed)
        ids = rng.integers(2, vocab_size, (num_prompts, prompt_tokens), np.int32)
        self.train = [Example(id=i, prompt_tokens=ids[i], answer="") for i in range(num_prompts)]
        self.eval = self.train[:8]
        self.long_prompts = 0

    def encode_prompt(self, example: Example) -> np.ndarray:
        """W1's prompts are ids with no text behind them: admission copies them per request."""
        return example.prompt_tokens.copy()

    def score(self, examples: Sequence[Example], completions: Sequence[np.ndarray]) -> np.ndarray:
        return np.array([np.mean(c % 2 == 0) if len(c) else 0.0 for c in completions], np.float32)

    def is_correct(self, rewards: np.ndarray) -> np.ndarray:
        return rewards >= 0.5


def build_w1_runner(config: Config) -> "CpuMarked":
    """`locoexp.main.build_in_process` (engine, trainer, step settings) with W1's random-prompt
    task, marked with CPU seconds and process age at each step's start."""
    d = config.dataset
    task = RandomPromptTask(
        vocab_size=config.model.vocab_size,
        prompt_tokens=d.max_prompt_tokens,
        num_prompts=8 * d.prompts_per_step,
        seed=d.seed,
    )
    schedule = PromptSchedule(
        len(task.train), d.prompts_per_step, seed=d.seed, batches_per_pass=None, passes=1
    )
    runner = build_in_process(config, task, schedule, HostGroup.current(), StepTimer())
    return CpuMarked(rollout=runner.rollout, trainer=runner.trainer, hosts=runner.hosts)


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
    """Step 0 (compiles) then `steps` timed steps, by the one step loop (O2 as configured).
    Returns the process age at the end of step 0 and every step's record."""
    plan = dataclasses.replace(plan, steps=steps + 1, eval_at_updates=(), eval_every_steps=0)
    sink, timer = Records(), runner.rollout.timer
    StepLoop(runner, plan, timer=timer, output=sink, start_time=time.perf_counter()).run()
    runner.marks.append((cpu_seconds(), process_age_s()))  # the end (after the final flush)
    cpu = [b[0] - a[0] for a, b in zip(runner.marks, runner.marks[1:], strict=False)]
    records = [{**r, "cpu_s": c} for r, c in zip(sink.steps, cpu, strict=True)]
    return runner.marks[1][1], records


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
        "forward_logprobs_s": lambda: trainer._logprobs(trainer.params, placed),
        "forward_body_s": lambda: body_forward(trainer.params, placed),
    }
    return {
        name: statistics.median(
            time_repeats(lambda fn=fn: jax.block_until_ready(fn()), repeats=repeats)
        )
        for name, fn in runs.items()
    }


# ---------------------------------------------------------------- report


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


def verdict(name: str, met: bool, detail: str) -> str:
    return f"  {name:<34} {'met' if met else 'NOT met':<8} {detail}"


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


def check_flops(parts: dict[str, list], r_flops: dict, t_flops: dict) -> None:
    """The shape terms count the same FLOPs as this script's closed forms (one model, two sums)."""
    pairs = [
        ("rollout", r_flops["total"]),
        ("prefill", r_flops["prefill"]),
        ("decode", r_flops["decode"]),
        ("train_step", t_flops["total"]),
        ("forward_body", t_flops["forward_body"]),
        ("forward_head", t_flops["forward_head"]),
    ]
    for part, expected in pairs:
        got = total_flops(parts[part])
        assert abs(got - expected) <= 1e-9 * expected, f"{part}: {got} vs {expected} FLOPs"


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


def step_timings(records: list[dict]) -> dict:
    """Medians over the steps after step 0 (which compiles) of the loop's own clocks."""
    steady = records[1:]
    return {
        "phases_s": {p: statistics.median(r[f"timing/{p}_s"] for r in steady) for p in PHASES},
        "step_s": statistics.median(r["timing/step_s"] for r in steady),
        "unaccounted_s": statistics.median(r["timing/unaccounted_s"] for r in steady),
        "cpu_s": statistics.median(r["cpu_s"] for r in steady),
        "step_decode_s_per_iteration": statistics.median(
            1e-3 * r["rollout/decode_ms_per_iteration"] for r in steady
        ),
        "reward_mean": [r["rollout/reward_mean"] for r in records],
        "first_step_record": records[0],
    }


def summarise(
    config: Config,
    runner: CpuMarked,
    records: list[dict],
    rollout: dict,
    rates: list[dict],
    shaped: dict,
) -> dict:
    """The report's figures: rollout and step against the square roofline and the shape floor."""
    m, d = config.model, config.dataset
    n = d.prompts_per_step * d.samples_per_prompt
    best = max(rates, key=lambda r: r["gflops"])
    r_flops = rollout_flops(m, sequences=n, prompt=d.max_prompt_tokens, new=d.max_new_tokens)
    rows = int(records[-1]["train/rows"])
    t_flops = train_flops(
        m,
        rows=rows,
        row_tokens=runner.rollout.settings.row_tokens,
        sequence_tokens=d.max_prompt_tokens + d.max_new_tokens,
        sequences=n,
        loss_slots=n * d.max_new_tokens,
    )
    parts = shaped["parts"]
    check_flops(parts, r_flops, t_flops)
    rate, rates_at = best["gflops"] * 1e9, shaped["rates"]
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
            "rows": rows,
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
    first_step_s, records = run_steps(runner, build_loop_plan(config), args.steps)
    rss_run = peak_rss_gb()
    n = d.prompts_per_step * d.samples_per_prompt
    rng = np.random.default_rng(1)
    prompts = [rng.integers(2, m.vocab_size, d.max_prompt_tokens, np.int32) for _ in range(n)]
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
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return report


def print_rates(r: dict) -> None:
    print("\n1. Matmul rate (fp32, median of timed repeats after warm-up):")
    for x in r["matmul"]:
        print(
            f"  {x['matmul']:<42} {x['backend']:<6} {x['seconds'] * 1e3:9.2f} ms  "
            f"{x['gflops']:8.1f} GFLOP/s"
        )
    print(
        f"  roofline denominator = best sustained rate: {r['roofline_gflops']:.1f} GFLOP/s "
        f"({r['roofline_source']})"
    )
    print(
        "  at the step's own matmul shapes (fastest timed call; XLA writing the product, XLA "
        "with it reduced in the same program ('fused'), NumPy; the shape floors divide each "
        "matmul's FLOPs by its shape's best rate):"
    )
    print(
        f"  {'shape':<30} {'used by':<26} {'XLA':>7} {'fused':>7} {'NumPy':>7} {'of roof':>8} "
        f"{'step GFLOP':>10}"
    )
    for x in sorted(r["shapes"], key=lambda x: -x["step_flops"]):
        print(
            f"  {x['shape']:<30} {','.join(x['used_by']):<26} {x['xla_gflops']:7.1f} "
            f"{x['xla_fused_gflops']:7.1f} {x['numpy_gflops']:7.1f} {x['of_roofline']:8.0%} "
            f"{x['step_flops'] / 1e9:10.2f}"
        )


def print_rollout(r: dict, m: ModelConfig) -> None:
    ro = r["rollout"]
    print(
        f"\n2. Rollout (JaxEngine.generate, 64 seqs x 64 prompt + 64 forced new tokens, T=1; "
        f"body {body_params(m) / 1e6:.2f}M + head {head_params(m) / 1e6:.2f}M matmul params):"
    )
    print(
        f"  wall {ro['seconds']:.2f} s (median)  {ro['tokens_per_s']:.0f} new tokens/s  "
        f"{ro['s_per_decode_iteration'] * 1e3:.1f} ms per decode iteration "
        f"({ro['decode_iterations']} iterations, prefill included); the engine's own clocks: "
        f"prefill {ro['engine_prefill_s'] * 1e3:.1f} ms, "
        f"{ro['engine_decode_s_per_iteration'] * 1e3:.1f} ms per decode iteration"
    )
    rf = ro["flops"]
    print(
        f"  FLOPs {rf['total'] / 1e9:.1f} G (prefill {rf['prefill'] / 1e9:.1f} G, decode "
        f"{rf['decode'] / 1e9:.1f} G) -> {rf['total'] / ro['seconds'] / 1e9:.1f} GFLOP/s = "
        f"{ro['roofline_fraction']:.1%} of the roofline; its shape floor "
        f"{ro['shape_floor_s']:.2f} s = {ro['shape_floor_fraction']:.1%} of the wall time"
    )


def print_step(r: dict) -> None:
    st = r["step"]
    tf = st["train_flops"]
    steps = len(st["reward_mean"]) - 1
    print(f"\n3. GRPO step (the step loop, medians of {steps} steps after step 0):")
    for name, seconds in st["phases_s"].items():
        print(f"  {name:<12} {seconds:8.3f} s")
    print(f"  {'unaccounted':<12} {st['unaccounted_s']:8.3f} s")
    print(
        f"  {'step':<12} {st['step_s']:8.3f} s (the step's own decode s/iteration: "
        f"{st['step_decode_s_per_iteration'] * 1e3:.1f} ms)"
    )
    print(
        f"  CPU time of this process per step {st['cpu_s']:.1f} s = "
        f"{st['cpu_s'] / st['step_s']:.2f} cores busy on average (of {r['cpus']}; less means "
        "other processes took the rest)"
    )
    print(
        f"  compute floor = (rollout {st['rollout_flops'] / 1e9:.1f} G + train "
        f"{tf['total'] / 1e9:.1f} G) / rate = {st['floor_s']:.2f} s; step / floor = "
        f"{st['step_over_floor']:.2f}\n  shape floor (each matmul at its shape's rate) = "
        f"{st['shape_floor_s']:.2f} s (train {st['train_shape_floor_s']:.2f} s); step / shape "
        f"floor = {st['step_over_shape_floor']:.2f}\n  train = 3 x forward: body over all "
        f"{st['rows']} rows x L tokens {tf['forward_body'] / 1e9:.1f} G + output head on the K "
        f"loss positions only {tf['forward_head'] / 1e9:.1f} G (what the trainer computes)"
    )
    print(f"  reward mean per step: {', '.join(f'{x:.3f}' for x in st['reward_mean'])}")
    step0, first = st["first_step_record"], r["first_step_s"]
    print(
        f"\n4. Time to first step (process start -> end of step 0): {first:.1f} s = start-up "
        f"(imports, config, model init) {first - step0['timing/step_s']:.1f} s + step 0 "
        f"{step0['timing/step_s']:.1f} s (generation {step0['timing/generation_s']:.1f} s, "
        f"train {step0['timing/train_s']:.1f} s, compiles included)"
    )
    print(f"  peak RSS after the W1 steps {r['peak_rss_gb_run']:.2f} GB")


def print_report(r: dict, m: ModelConfig) -> None:
    print_rates(r)
    print_rollout(r, m)
    print_step(r)
    ro, st = r["rollout"], r["step"]
    print("\n5. Verdicts (CPU figures; the targets are against the square roofline):")
    fraction, ratio = ro["roofline_fraction"], st["step_over_floor"]
    checks = [
        (
            "rollout >= 70% of matmul roofline",
            fraction >= TARGETS["rollout_roofline_min"],
            f"{fraction:.1%} (its shape floor: {ro['shape_floor_fraction']:.1%})",
        ),
        (
            "GRPO step <= 1.5 x compute floor",
            ratio <= TARGETS["step_over_floor_max"],
            f"{st['step_s']:.2f} s / {st['floor_s']:.2f} s = {ratio:.2f}x "
            f"(shape floor: {st['step_over_shape_floor']:.2f}x)",
        ),
        (
            "time to first step <= 30 s",
            r["first_step_s"] <= TARGETS["first_step_s_max"],
            f"{r['first_step_s']:.1f} s",
        ),
        (
            "peak RSS <= 3 GB",
            r["peak_rss_gb_run"] <= TARGETS["peak_rss_gb_max"],
            f"{r['peak_rss_gb_run']:.2f} GB",
        ),
    ]
    for name, met, detail in checks:
        print(verdict(name, met, detail), flush=True)


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
    main()
