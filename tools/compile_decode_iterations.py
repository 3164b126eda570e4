"""The decode iteration of a model at a rollout TP compiled by XLA-TPU, its figures cached for
`python -m locoexp.analysis predict` (Eq. 2's Q_w, Q_KV and the TP collectives; issue 41).

    python tools/compile_decode_iterations.py [--models qwen3_0_6b qwen3_4b] [--tp 1 2]
        [--hardware tpu_v7x_8] [--rows 16] [--dtype bfloat16]
        [--cache experiments/compiled/decode_iterations.jsonl]

For each (model, TP) the engine's `iteration` program (`decode.iteration`: `run`'s loop body,
one token for each of `--rows` rows of one replica on TP devices of the slice, dense cache) is
compiled with libtpu's topology (no TPU) at two depths (`--cuts`, the engine's programs are
unrolled over layers) and, at the deeper cut, at two cache lengths. Every figure is read from
XLA-TPU's compiled program and extrapolated to the model's depth on the line through the cuts:

- `weight_bytes`: the program's argument bytes per device less its KV cache, i.e. the weights a
  device holds at TP t (Eq. 2's Q_w / t, replicated parts included);
- `kv_bytes_per_token`: per device, the cache's argument bytes per cached token of one row (the
  difference between the two cache lengths);
- `xla_bytes_accessed`, `xla_flops`: XLA-TPU's `cost_analysis()` of the iteration at the short
  cache; bytes accessed counts every operand and output of every op in any memory space (VMEM
  copies of the weights count twice, the embedding gather counts the whole table), so it is
  kept as a compiler figure beside Q_w, not used as Eq. 2's bytes term;
- `xla_flops_per_cached_token`: XLA-TPU's FLOPs per cached token of one row (the difference
  between the two cache lengths: attention over the cache), which training and prefill add per
  token of context (locoexp/analysis/step.py);
- `collectives`: the collective ops in the compiled program (all-reduce, all-gather,
  reduce-scatter, all-to-all, collective-permute; an async pair counts once).

Each line is appended to the cache and a (model, chip, TP, rows, dtype, cuts) already there is
not compiled again. `--lengths` writes instead the mean prompt and completion tokens of the
datasets' stored rows (`length_mix.jsonl`, tools/bench_paged_tpu_bytes.py's mix: the reference
solutions after the chat-formatted prompts, Qwen3 tokens, capped at the caps).
"""

import argparse
import dataclasses
import json
import re
import time
from pathlib import Path

from locoexp.compose import compose_config, use_cpu_backend

COMPILED = Path(__file__).resolve().parents[1] / "experiments" / "compiled"
CACHE = COMPILED / "decode_iterations.jsonl"
COLLECTIVE = re.compile(
    r"= [^=]*? (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\("
)


def run_config(model, hardware, tp: int, dtype: str, layers: int, new_tokens: int, extra=()):
    return compose_config(
        [
            *extra,
            f"model={model}",
            f"model.num_layers={layers}",
            "dataset=gsm8k",
            "dataset.max_prompt_tokens=16",
            f"dataset.max_new_tokens={new_tokens}",
            f"hardware={hardware}",
            "rollout=jax",
            f"rollout.tensor_parallel={tp}",
            f"rollout.param_dtype={dtype}",
            "rollout.kv_cache=dense",
        ]
    )


_COMPILED: dict[str, dict] = {}


def compile_iteration(config, rows: int) -> dict:
    """XLA-TPU's figures of one decode iteration of `rows` rows on one replica of TP devices,
    compiled once per process for a given cut: models that differ only in name and depth (the
    synthetic ~100B and ~200B and Llama-3.1-405B, Table H1) share their cuts' programs."""
    key = repr((dataclasses.replace(config.model, name=""), config.hardware, config.rollout, rows,
                config.dataset.max_new_tokens))  # fmt: skip
    if key not in _COMPILED:
        _COMPILED[key] = _compile_iteration(config, rows)
    return _COMPILED[key]


def _compile_iteration(config, rows: int) -> dict:
    from locoexp.compiled import topology  # noqa: PLC0415  (jax after the backend is chosen)
    from locoexp.compiled.programs import abstract_model, lower_decode_iteration  # noqa: PLC0415
    from locoexp.rollout import scheduling  # noqa: PLC0415
    from locoexp.rollout.config import SamplingParams  # noqa: PLC0415
    from locoexp.rollout.engine import JaxEngine, padded_prompt_tokens  # noqa: PLC0415

    tp = config.rollout.tensor_parallel
    devices = topology.topology_devices(config.hardware)[:tp]
    model = abstract_model(config.model)
    engine = JaxEngine(model, config.rollout, eos_id=0, pad_id=0, devices=devices, abstract=True)
    prompt = padded_prompt_tokens(config.dataset.max_prompt_tokens, config.rollout)
    new = config.dataset.max_new_tokens
    chunk = min(config.rollout.prefill_chunk_tokens, prompt)
    lowered = lower_decode_iteration(
        engine, scheduling.Call(prompt, new, chunk, SamplingParams(1.0)), rows
    )
    begin = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - begin
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return {
        "argument": float(compiled.memory_analysis().argument_size_in_bytes),
        "bytes_accessed": float(cost["bytes accessed"]),
        "flops": float(cost["flops"]),
        "collectives": len(COLLECTIVE.findall(compiled.as_text())),
        "slots": prompt + new,  # cache slots a row holds
        "device_kind": devices[0].device_kind,
        "seconds": seconds,
    }


def at_depth(low: dict, high: dict, cuts: tuple[int, int], depth: int, key: str) -> float:
    """`key` at `depth` layers on the line through the two cuts' figures."""
    (a, b), y0, y1 = cuts, low[key], high[key]
    return y0 + (y1 - y0) / (b - a) * (depth - a)


def figures(model: str, hardware: str, tp: int, rows: int, dtype: str, cuts, extra=()) -> dict:
    """The cache line of `model` (with `extra` overrides) at TP `tp`: see the module's notes."""
    depth = compose_config([f"model={model}", *extra]).model.num_layers
    a, b = cuts
    low = compile_iteration(run_config(model, hardware, tp, dtype, a, 16, extra), rows)
    high = compile_iteration(run_config(model, hardware, tp, dtype, b, 16, extra), rows)
    longer = compile_iteration(run_config(model, hardware, tp, dtype, b, 144, extra), rows)
    # the cache's bytes per cached token of one row at `b` layers, per layer, at full depth
    slots = rows * (longer["slots"] - high["slots"])
    per_token = (longer["argument"] - high["argument"]) / slots
    kv_per_token = per_token / b * depth
    # XLA's FLOPs per cached token of one row (attention's QK and PV over the dense cache)
    attention_flops = (longer["flops"] - high["flops"]) / slots / b * depth
    argument = at_depth(low, high, cuts, depth, "argument")
    return {
        "model": model,
        "hardware": hardware,
        "device_kind": low["device_kind"],
        "tp": tp,
        "rows": rows,
        "dtype": dtype,
        "cuts": list(cuts),
        "layers": depth,
        "weight_bytes": argument - kv_per_token * rows * high["slots"],
        "kv_bytes_per_token": kv_per_token,
        "xla_bytes_accessed": at_depth(low, high, cuts, depth, "bytes_accessed"),
        "xla_flops": at_depth(low, high, cuts, depth, "flops"),
        "xla_flops_per_cached_token": attention_flops,
        "collectives": round(at_depth(low, high, cuts, depth, "collectives")),
        "short_cache_slots": high["slots"],
        "compile_s": low["seconds"] + high["seconds"] + longer["seconds"],
    }


def cached(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


IDENTITY = ("model", "hardware", "tp", "rows", "dtype", "cuts")


def write_lengths() -> None:
    """One line per dataset with stored rows: mean prompt and completion tokens."""
    from bench_paged_tpu_bytes import SOURCES, length_mix  # noqa: PLC0415  (tools/)

    with (COMPILED / "length_mix.jsonl").open("w") as sink:
        for dataset in SOURCES:
            prompts, completions = length_mix(dataset, compose_config([f"dataset={dataset}"]))
            line = dict(dataset=dataset, stored_rows=len(prompts),
                        mean_prompt_tokens=float(prompts.mean()),
                        mean_completion_tokens=float(completions.mean()),
                        source="stored rows' reference solutions, Qwen3 tokens")  # fmt: skip
            sink.write(json.dumps(line) + "\n")
            print(json.dumps(line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["qwen3_0_6b"])
    parser.add_argument("--tp", nargs="+", type=int, default=[1])
    parser.add_argument("--hardware", default="tpu_v7x_8")
    parser.add_argument("--rows", type=int, default=16, help="rows of the one replica")
    parser.add_argument("--dtype", default="bfloat16", help="rollout.param_dtype")
    parser.add_argument("--cuts", type=int, nargs=2, default=[2, 4], help="layers compiled")
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--lengths", action="store_true", help="write length_mix.jsonl only")
    args = parser.parse_args()
    use_cpu_backend()
    if args.lengths:
        write_lengths()
        return
    done = {tuple(json.dumps(r[k]) for k in IDENTITY) for r in cached(args.cache)}
    for model in args.models:
        for tp in args.tp:
            row = dict(model=model, hardware=args.hardware, tp=tp, rows=args.rows,
                       dtype=args.dtype, cuts=list(args.cuts))  # fmt: skip
            if tuple(json.dumps(row[k]) for k in IDENTITY) in done:
                print(f"{model} TP{tp}: cached")
                continue
            out = figures(model, args.hardware, tp, args.rows, args.dtype, tuple(args.cuts))
            with args.cache.open("a") as sink:
                sink.write(json.dumps(out) + "\n")
            print(json.dumps(out))


if __name__ == "__main__":
    main()
