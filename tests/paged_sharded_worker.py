"""Run in a subprocess by tests/test_paged_sharded_engine.py, with 4 CPU devices set before jax
starts: on each sharded layout (DP2 x TP2, and a mixture of experts at EP2) the
dense-cache engine and the paged one with a pool of one row at its caps per replica (rows wait
and are preempted on every replica), on the same requests; the single-device dense engine as
the reference. Writes each engine's greedy rollout, and for each paged layout the collectives
of its compiled slot programs that carry a cache-shaped array, to an .npz file (argument 1)."""

import dataclasses
import os
import re
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from tiny_policy import PAD, TINY, random_prompts, tiny_model  # noqa: E402

from locoexp.model.transformer import build_model  # noqa: E402
from locoexp.rollout.config import KVCacheKind, RolloutConfig, SamplingParams  # noqa: E402
from locoexp.rollout.engine import JaxEngine  # noqa: E402

MAX_NEW, PAGE = 12, 4
LENGTHS = (3, 5, 9, 4, 7, 2, 6, 8, 5, 3, 11, 2, 4, 6, 9, 3)
CAPS = (12, 3, 7, 12, 1, 9, 5, 12, 12, 2, 10, 6, 8, 12, 4, 11)
ROW_PAGES = -(-(max(p + c for p, c in zip(LENGTHS, CAPS, strict=True))) // PAGE)
QWEN3_MOE = dataclasses.replace(TINY, num_experts=4, experts_per_token=2, expert_mlp_dim=16)
# name: (model, tensor parallel, expert parallel, devices)
LAYOUTS = {
    "tp1": ("dense", 1, 0, 1),
    "dp2tp2": ("dense", 2, 0, 4),
    "moe_tp1": ("moe", 1, 0, 1),
    "moe_ep2": ("moe", 1, 2, 2),
}
COLLECTIVE = re.compile(
    r"= (.+?) (all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)(-start)?\("
)


def cache_collectives(compiled, *, head_dim: int) -> int:
    """Collectives of a compiled program carrying an array of the cache's kind: three or more
    axes, the last one head_dim (a pool's pages, a prefilled row, a page table gather)."""
    found = 0
    for line in compiled.as_text().splitlines():
        match = COLLECTIVE.search(line)
        shapes = re.findall(r"\[([0-9,]*)\]", match.group(1)) if match else []
        dims = [[int(d) for d in shape.split(",")] for shape in shapes if shape]
        found += any(len(d) >= 3 and d[-1] == head_dim for d in dims)
    return found


def main(path: str) -> None:
    models = {"dense": tiny_model(seed=0), "moe": build_model(QWEN3_MOE, seed=0)}
    prompts = random_prompts(LENGTHS, seed=4)
    out = {}
    for name, (kind, tp, ep, devices) in LAYOUTS.items():
        for cache in (KVCacheKind.dense, KVCacheKind.paged):
            if cache is KVCacheKind.paged and devices == 1:
                continue  # tests/test_paged_engine.py
            config = RolloutConfig(
                tensor_parallel=tp, expert_parallel=ep, prompt_bucket_tokens=1,
                prefill_chunk_tokens=4, capacity=4 * (devices // tp), kv_cache=cache,
                page_tokens=PAGE,
                kv_cache_pages_per_replica=ROW_PAGES if cache is KVCacheKind.paged else None,
            )  # fmt: skip
            engine = JaxEngine(
                models[kind], config, eos_id=-1, pad_id=PAD, devices=jax.devices()[:devices]
            )
            rollout = engine.generate(
                prompts, key=jax.random.key(5), max_new_tokens=MAX_NEW,
                sampling=SamplingParams(temperature=0.0, ignore_eos=True), request_caps=CAPS,
            )  # fmt: skip
            label = f"{name}_{cache.value}"
            out[f"{label}_tokens"], out[f"{label}_lengths"] = rollout.tokens, rollout.lengths
            out[f"{label}_refills"] = rollout.refills
            if cache is KVCacheKind.paged:
                out[f"{label}_cache_collectives"] = np.array(
                    [
                        cache_collectives(c, head_dim=TINY.head_dim)
                        for c in engine.slot_programs._compiled.values()
                    ]
                )
    np.savez(path, **out)


if __name__ == "__main__":
    main(sys.argv[1])
