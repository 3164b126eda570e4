"""Bytes accessed per decode iteration on TPU, dense against paged KV cache (issue 42, bench 3a).

    python tools/bench_paged_tpu_bytes.py [--model qwen3_0_6b] [--hardware tpu_v7x_8]
        [--slots 32] [--cuts 2 4] [--dtype bfloat16] [--datasets gsm8k numinamath_cot]
        [--json out.json]

For each dataset's caps (`dataset.max_prompt_tokens`, `dataset.max_new_tokens`) the engine's
decode iteration is compiled with XLA-TPU from libtpu's topology (no TPU; one device: TP1, one
replica of `--slots` rows) with `rollout.kv_cache=dense` and `=paged` (the ragged paged
attention kernel, locoexp/model/paged_kernel.py; the pool at its default, every slot at its
caps; the engine in `--dtype`), as `decode.iteration`: `run`'s loop body alone, because XLA's
cost analysis counts a while loop's body once whatever its trip count. The engine's programs
are unrolled over the layers, so they are compiled at two cuts (`--cuts`, as dry_run=compile
does) and XLA's figure read at the model's depth on the line through them (bytes grow by one
layer's weights and cache a layer).

Two kinds of figure, labelled so in the output:
- XLA: `compiled.cost_analysis()["bytes accessed"]` of that program, a compiler figure. It
  does not depend on the rows' lengths. The dense cache's attention reads all P' + M slots of
  every row. The kernel (a Mosaic custom call whose pool operand stays in HBM and is read by
  its own DMAs) is not counted by its pool: XLA-TPU's total for the kernel compiled alone is
  under a megabyte for a 320 MiB pool (`kernel_alone`, printed; its per-operand entry
  "bytes accessed6{}" names the pool whole, the total leaves it out). So the paged program's
  XLA figure is everything but the kernel's page reads.
- model: the bytes the kernel's DMAs read by construction (kernel.py,
  `MultiPageAsyncCopyDescriptor`): per layer and row, its pages rounded up to whole blocks of
  `num_kv_pages_per_block` pages (every block copies that many pages; one past the row's end
  copies the row's first page again), at the block size the engine's call takes on the target
  (`paged_kernel.block_sizes`, halved by `fit_vmem` where its blocks would not fit VMEM). The
  paged iteration's model figure is XLA's plus these DMAs. At a row length mix it is averaged
  over each row's own decode iterations (a row of prompt p and completion c is at p + 1 ..
  p + c tokens).
The length mixes are the datasets' reference solutions (GSM8K train's `answer`, the stored
NuminaMath-CoT rows' `solution`) after their chat-formatted prompts, in Qwen3 tokens, capped at
the caps: a policy's completions (Qwen3 thinking) may be longer.
"""

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

from locoexp.compiled import topology
from locoexp.compiled.programs import abstract_model, lower_decode_iteration
from locoexp.compose import compose_config
from locoexp.dataset.prompts import encode_chat_prompt
from locoexp.model.paged_kernel import block_sizes, fit_vmem, vmem_limit
from locoexp.rollout import scheduling
from locoexp.rollout.config import SamplingParams
from locoexp.rollout.engine import JaxEngine, padded_prompt_tokens
from locoexp.rollout.pages import pages_for
from locoexp.tokenizer.qwen3 import Qwen3Tokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SOURCES = {  # the stored rows: (file, problem column, solution column)
    "gsm8k": (DATA / "gsm8k" / "train.jsonl", "question", "answer"),
    "numinamath_cot": (
        DATA / "numinamath_cot" / "cn_k12_math_problems_weak_solutions_250.csv",
        "problem",
        "solution",
    ),
}
GIB = 1 << 30


def run_config(args, dataset: str, cache: str, layers: int | None = None):
    """The run's config at `dataset`'s caps, TP1, with the KV cache `cache` (cut to `layers`)."""
    cut = [f"model.num_layers={layers}"] if layers else []
    return compose_config(
        [
            f"model={args.model}",
            *cut,
            f"dataset={dataset}",
            f"hardware={args.hardware}",
            "rollout.tensor_parallel=1",
            f"rollout.param_dtype={args.dtype}",
            f"rollout.kv_cache={cache}",
        ]
    )


def cost_at_depth(dataset: str, cache: str, device, width: int) -> tuple[float, float, int, int]:
    """`iteration_cost` at the model's depth, on the line through the `--cuts` compiled."""
    (a, b), depth = ARGS.cuts, run_config(ARGS, dataset, cache).model.num_layers
    low = iteration_cost(run_config(ARGS, dataset, cache, a), device, width)
    high = iteration_cost(run_config(ARGS, dataset, cache, b), device, width)
    at_depth = low[0] + (high[0] - low[0]) / (b - a) * (depth - a)
    return at_depth, low[1] + high[1], low[2], low[3]


def iteration_cost(config, device, width: int) -> tuple[float, float, int, int]:
    """(XLA's bytes accessed, compile seconds, P', pages per slot Q) of one decode iteration."""
    engine = JaxEngine(
        abstract_model(config.model),
        config.rollout,
        eos_id=0,
        pad_id=0,
        devices=[device],
        abstract=True,
    )
    prompt_len = padded_prompt_tokens(config.dataset.max_prompt_tokens, config.rollout)
    max_new, page = config.dataset.max_new_tokens, config.rollout.page_tokens
    chunk = min(config.rollout.prefill_chunk_tokens, prompt_len)
    call = scheduling.Call(prompt_len, max_new, chunk, SamplingParams(1.0))
    lowered = lower_decode_iteration(engine, call, width)
    begin = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - begin
    text = compiled.as_text()
    if config.rollout.kv_cache.value == "paged":
        assert text.count("tpu_custom_call") >= config.model.num_layers, "no kernel compiled"
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["bytes accessed"]), seconds, prompt_len, pages_for(prompt_len + max_new, page)


def length_mix(dataset: str, config) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, completion tokens) of every stored row, capped at the caps."""
    path, problem, solution = SOURCES[dataset]
    if path.suffix == ".csv":
        csv.field_size_limit(sys.maxsize)
        rows = list(csv.DictReader(path.open(newline="")))
    else:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    tokenizer, d = Qwen3Tokenizer(), config.dataset
    prompts, completions = [], []
    for row in rows:
        content = d.prompt_template.replace("{problem}", str(row[problem]))
        message = ({"role": "user", "content": content},)
        prompts.append(len(encode_chat_prompt(tokenizer, message, thinking=d.thinking)))
        completions.append(len(tokenizer.encode(str(row[solution]))))
    return (
        np.minimum(prompts, d.max_prompt_tokens),
        np.clip(completions, 1, d.max_new_tokens),
    )


def dma_pages(lengths: np.ndarray, page: int, per_block: int) -> np.ndarray:
    """Pages the kernel's DMAs copy for rows of `lengths` tokens: whole blocks of pages."""
    return -(-pages_for(lengths, page) // per_block) * per_block


def mean_dma_pages(prompts, completions, page: int, per_block: int) -> float:
    """The kernel's DMA pages of one row at one decode iteration, averaged over each row's own
    iterations (lengths p + 1 .. p + c) and over the rows."""
    per_row = [
        dma_pages(p + np.arange(1, c + 1), page, per_block).mean()
        for p, c in zip(prompts, completions, strict=True)
    ]
    return float(np.mean(per_row))


def kernel_block(device, m, dtype, page: int, width: int, q: int) -> int:
    """The kv pages a block the engine's kernel call takes on `device` for model `m`'s layer:
    the tuned table's (`block_sizes`), halved where it would not fit VMEM (`fit_vmem`)."""
    per_block, queries = block_sizes(
        device.device_kind, dtype, m.num_heads, m.num_kv_heads, m.head_dim, page, width, q
    )
    pool = jax.ShapeDtypeStruct((width * q, page, 2 * m.num_kv_heads, m.head_dim), dtype)
    with jax.set_mesh(jax.sharding.Mesh(np.array([device]), ("x",))):  # the target's VMEM
        per_block = fit_vmem(pool, m.num_heads, per_block, queries, vmem_limit())
    return per_block


def bench(dataset: str, device, width: int) -> list[dict]:
    """One dataset's rows of the table: dense and paged, at the caps and at the length mix."""
    out = []
    paged = run_config(ARGS, dataset, "paged")
    dense_bytes, dense_s, prompt_len, q = cost_at_depth(dataset, "dense", device, width)
    paged_bytes, paged_s, _, _ = cost_at_depth(dataset, "paged", device, width)
    m, dtype = paged.model, jnp.dtype(ARGS.dtype)
    page, layers = paged.rollout.page_tokens, m.num_layers
    per_block = kernel_block(device, m, dtype, page, width, q)
    itemsize = dtype.itemsize
    page_bytes = page * 2 * m.num_kv_heads * m.head_dim * itemsize  # one layer's page
    pools = layers * width * q * page_bytes  # the pools' size (every slot at its caps)
    caps = prompt_len + paged.dataset.max_new_tokens
    prompts, completions = length_mix(dataset, paged)
    common = dict(
        dataset=dataset,
        device=device.device_kind,
        slots=width,
        layers=layers,
        page=page,
        dtype=ARGS.dtype,
        cuts=ARGS.cuts,
        kv_pages_per_block=per_block,
        prompt_slots=prompt_len,
        pages_per_slot=q,
    )
    out.append(
        dict(
            common,
            cache="dense",
            lengths="any",
            xla_gib=dense_bytes / GIB,
            cache_gib=pools / GIB,  # the same P' + M slots a row, whole pages
            compile_s=dense_s,
        )
    )
    lengths = {
        f"caps ({caps} tokens)": float(dma_pages(np.array([caps]), page, per_block)[0]),
        f"mix (mean {prompts.mean():.0f} + {completions.mean():.0f} tokens, {len(prompts)} rows)": (
            mean_dma_pages(prompts, completions, page, per_block)
        ),
    }
    paged_row = dict(common, cache="paged", xla_gib=paged_bytes / GIB, cache_gib=pools / GIB)
    for label, pages in lengths.items():
        dma = layers * width * pages * page_bytes  # the kernel's DMAs (the model)
        model = (paged_bytes + dma) / GIB
        out.append(
            dict(
                paged_row,
                lengths=label,
                kernel_dma_gib=dma / GIB,
                model_gib=model,
                compile_s=paged_s,
            )
        )
    return out


def kernel_alone(device, pages: int) -> tuple[float, int]:
    """(XLA-TPU's bytes accessed, the pool's bytes) of the kernel compiled alone on `device`
    with a bfloat16 pool of `pages` pages of Qwen3-0.6B's layer (32 rows, 160 pages each)."""
    mesh = jax.sharding.Mesh(np.array([device]), ("x",))
    one = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    shape = lambda s, t=jnp.int32: jax.ShapeDtypeStruct(s, t, sharding=one)  # noqa: E731
    pool = shape((pages, 16, 16, 128), jnp.bfloat16)
    call = lambda q, kv, n, t, c, s: ragged_paged_attention(  # noqa: E731
        q, kv, n, t, c, s, num_kv_pages_per_block=128, num_queries_per_block=32
    )
    spec = jax.sharding.PartitionSpec()
    kernel = jax.jit(
        jax.shard_map(call, mesh=mesh, in_specs=(spec,) * 6, out_specs=spec, check_vma=False)
    )
    args = (shape((32, 16, 128), jnp.bfloat16), pool, shape((32,)), shape((32, 160)))
    compiled = kernel.lower(*args, shape((33,)), shape((1,))).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["bytes accessed"]), pages * 16 * 16 * 128 * 2


def main() -> None:
    hardware = compose_config([f"hardware={ARGS.hardware}"]).hardware
    device = topology.topology_devices(hardware)[0]
    counted, pool = kernel_alone(device, 5120)
    print(
        f"the kernel alone on {device.device_kind}: XLA bytes accessed {counted:,.0f} for a "
        f"pool of {pool:,} bytes (XLA-TPU does not count the kernel's page reads)"
    )
    rows = [row for dataset in ARGS.datasets for row in bench(dataset, device, ARGS.slots)]
    print(
        f"{'dataset':<15} {'cache':<6} {'lengths':<44} {'XLA GiB':>8} {'cache GiB':>9} "
        f"{'DMA GiB':>8} {'model GiB':>9}"
    )
    for r in rows:
        cells = [
            f"{r.get(k, float('nan')):>8.3f}"
            for k in ("xla_gib", "cache_gib", "kernel_dma_gib", "model_gib")
        ]
        print(f"{r['dataset']:<15} {r['cache']:<6} {r['lengths']:<44} {' '.join(cells)}")
    if ARGS.json:
        Path(ARGS.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3_0_6b")
    parser.add_argument("--hardware", default="tpu_v7x_8")
    parser.add_argument("--slots", type=int, default=32, help="rows decoded (the issue's 32)")
    parser.add_argument("--cuts", type=int, nargs=2, default=[2, 4], help="layers compiled")
    parser.add_argument("--dtype", default="bfloat16", help="rollout.param_dtype")
    parser.add_argument("--datasets", nargs="+", default=["gsm8k", "numinamath_cot"])
    parser.add_argument("--json", help="write the rows here")
    ARGS = parser.parse_args()
    main()
