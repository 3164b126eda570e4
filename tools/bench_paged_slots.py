"""Issue 42's benchmark 3b: slots that fit in the same HBM, dense against paged KV cache.

    python tools/bench_paged_slots.py [--hardware tpu_v7x_8] [--model qwen3_0_6b]
    python tools/bench_paged_slots.py --compile numinamath_cot   # + XLA-TPU's figures

Plan arithmetic, not a measurement: every figure is the memory plan's (locoexp/planner; the
paged pool and its slots are planner/pages.py), for Table 1's GSM8K and NuminaMath workloads
(`+workload=...`: the paper's rows per step and trainer dtypes, the built-in JAX engine,
colocated) at their caps and at their real length mix, dense against paged.

The length mix is measured here from the real rows in /work/shared/data (read in place): the
prompt is the dataset's template over the problem, rendered with Qwen3's chat template in the
dataset's thinking mode (as `locoexp.dataset` renders it), the response is the row's reference
solution (GSM8K `answer`, NuminaMath `solution`), both in Qwen3 tokens, capped as a run caps them
(prompts over the cap dropped, responses cut at the cap). The reference solutions stand in for
the policy's completions, which cannot be generated here (Qwen3-0.6B's own outputs, with
thinking on NuminaMath, may run longer): the plan at the mix is sized by their mean row
(`dataset.mean_sequence_tokens`), and a pool sized by it waits and preempts when rows run
longer, never runs out of memory. NuminaMath's rows are 250 cn_k12 rows (one source of many).

Columns: expected row tokens (the plan's, and where from); the pool per replica in pages and
GiB per device (dense: the cache); slots that fit per engine (the memory alone, not capped by
the engine's requests); the plan's capacity per engine (capped by its requests and balanced
over waves, `rollout.capacity=0`) and the waves that gives for the paper's rows per step.
`--compile` adds XLA-TPU's figures (compiler figures, not a run) for the paged engine's
programs at the plan's capacity and pool at the length mix.
"""

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from locoexp.compose import compose_config
from locoexp.config import Config
from locoexp.dataset.prompts import encode_chat_prompt
from locoexp.planner import fit
from locoexp.planner.estimate import GIB
from locoexp.session.build import plan_setup
from locoexp.tokenizer.qwen3 import Qwen3Tokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SOURCES = {  # workload: (file, problem column, reference solution column)
    "gsm8k": (DATA / "gsm8k" / "train.jsonl", "question", "answer"),
    "numinamath_cot": (
        DATA / "numinamath_cot" / "cn_k12_math_problems_weak_solutions_250.csv",
        "problem",
        "solution",
    ),
}
UNCAPPED = 1 << 14  # sequences per replica the search for "slots that fit" may reach


def rows_of(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    csv.field_size_limit(sys.maxsize)
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def length_mix(config: Config, workload: str) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, response tokens) of the workload's real rows, as a run caps them."""
    path, problem, solution = SOURCES[workload]
    d, tokenizer = config.dataset, Qwen3Tokenizer()
    prompts, responses = [], []
    for row in rows_of(path):
        content = d.prompt_template.replace("{problem}", str(row[problem]))
        messages = ({"role": "user", "content": content},)
        prompt = len(encode_chat_prompt(tokenizer, messages, thinking=d.thinking))
        if prompt > d.max_prompt_tokens:  # long_prompts=drop (both workloads)
            continue
        prompts.append(prompt)
        responses.append(min(len(tokenizer.encode(str(row[solution]))), d.max_new_tokens))
    return np.array(prompts), np.array(responses)


def describe_mix(workload: str, prompts: np.ndarray, responses: np.ndarray) -> str:
    rows = prompts + responses

    def stats(x: np.ndarray) -> str:
        return f"mean {x.mean():.0f}, median {statistics.median(x):.0f}, max {x.max()}"

    return (
        f"{workload}: {len(rows)} rows ({SOURCES[workload][0].name}); prompt {stats(prompts)}; "
        f"reference response {stats(responses)}; row {stats(rows)} tokens"
    )


def row(overrides: list[str], label: str) -> dict:
    """One cell: the plan's capacity and waves, and the slots the memory alone fits."""
    setup = plan_setup(compose_config(overrides))
    plan = fit.resolve_plan(setup)
    micro = plan.trainer_shape.micro_batch_rows
    most = fit.most_per_replica(setup, micro=micro, most=UNCAPPED)
    pool = plan.pool
    return {
        "label": label,
        "expected": f"{pool.expected_row_tokens}" if pool else "caps",
        "pages": f"{pool.pages}" if pool else "-",
        "kv_gib": plan.engine.kv_cache / GIB,
        "fit": most * plan.replicas_per_engine,
        "capacity": plan.capacity,
        "requests": plan.requests_per_engine,
        "waves": plan.waves,
        "peak": plan.engine_peak / GIB,
    }


def table(args) -> tuple[list[str], dict[str, int]]:
    """The table's lines, and each workload's mean row (tokens)."""
    lines = [
        "| workload | lengths | cache | expected row tokens | pool pages per replica | "
        "KV GiB per device | slots that fit per engine | plan capacity per engine (of "
        "requests) | waves | engine GiB per device | slots vs dense |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    means = {}
    for workload in SOURCES:
        base = [f"hardware={args.hardware}", f"model={args.model}", f"+workload={workload}"]
        prompts, responses = length_mix(compose_config(base), workload)
        print(describe_mix(workload, prompts, responses))
        mean = means[workload] = int(np.ceil((prompts + responses).mean()))
        for lengths, mix in (("caps", []), ("mix", [f"dataset.mean_sequence_tokens={mean}"])):
            cells = [row([*base, *mix, f"rollout.kv_cache={kv}"], kv) for kv in ("dense", "paged")]
            for cell in cells:
                lines.append(
                    f"| {workload} | {lengths} | {cell['label']} | {cell['expected']} | "
                    f"{cell['pages']} | {cell['kv_gib']:.1f} | {cell['fit']} | "
                    f"{cell['capacity']} ({cell['requests']}) | {cell['waves']} | "
                    f"{cell['peak']:.1f} | {cell['fit'] / cells[0]['fit']:.2f}x |"
                )
    return lines, means


def compile_engine(overrides: list[str]) -> list[str]:
    """XLA-TPU's figures for the engine's programs at the plan's capacity and pool: compiled
    without a TPU for the slice's topology (libtpu, locoexp/compiled) at two layer cuts and
    read at the model's depth on the line through them, as `dry_run=compile` reads them."""
    from locoexp.compiled.programs import compile_programs  # noqa: PLC0415  (jax, libtpu)
    from locoexp.compiled.topology import topology_devices  # noqa: PLC0415
    from locoexp.compiled.verdict import at_depth, layer_cuts, run_shapes  # noqa: PLC0415

    config = compose_config(overrides)
    shapes, devices = run_shapes(config), topology_devices(config.hardware)
    cuts = layer_cuts(config.model)
    compiled = [compile_programs(shapes, devices, layers=n, roles=("engine",)) for n in cuts]
    layers = config.model.num_layers
    programs = compiled[0] if len(cuts) == 1 else at_depth(*compiled, cuts, layers)
    plan = shapes.plan
    lines = [
        f"XLA-TPU, {' '.join(overrides)}: capacity {plan.capacity}, pool "
        f"{shapes.rollout.kv_cache_pages_per_replica} pages per replica; compiled at "
        f"{' and '.join(map(str, cuts))} layers, read at {layers}; plan's engine "
        f"{plan.engine_peak / GIB:.2f} GiB per device"
    ]
    for p in programs:
        refused = f", refused: {p.refusal}" if p.refusal else ""
        lines.append(f"  {p.name}: peak {p.peak / GIB:.2f} GiB per device{refused}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default="tpu_v7x_8")
    parser.add_argument("--model", default="qwen3_0_6b")
    parser.add_argument(
        "--compile",
        nargs="*",
        default=None,
        metavar="WORKLOAD",
        help="also compile the paged engine at the length mix for XLA-TPU (minutes per workload)",
    )
    args = parser.parse_args()
    print(
        f"slots in the same HBM, {args.model} on {args.hardware}, rollout=jax colocated, plan "
        "arithmetic (locoexp/planner), not a measurement"
    )
    lines, means = table(args)
    print("\n".join(lines))
    for workload in args.compile or []:
        base = [f"hardware={args.hardware}", f"model={args.model}", f"+workload={workload}"]
        mix = [f"dataset.mean_sequence_tokens={means[workload]}", "rollout.kv_cache=paged"]
        print("\n".join(compile_engine([*base, *mix])))


if __name__ == "__main__":
    main()
