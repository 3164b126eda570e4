"""W1 rollout throughput and weight-publication time: `rollout=vllm` beside `rollout=jax`.

W1 is the paper's test model at CPU size: the Qwen3 architecture, random init, vocabulary
151,936, width 256, MLP 768, 4 layers, 4 query / 2 KV heads, head_dim 64, tied embeddings, fp32;
8 prompts x 8 generations, 64 prompt tokens, 64 forced new tokens (EOS ignored). Each engine
starts once, generates once to warm up (compiles), then `--repeats` timed generations; the
publication time is `load_weights` of the full parameter state, blocked until done.

Run in the vLLM virtualenv (README.md, section "vLLM backend (rollout=vllm)"):

    /opt/vllm-venv/bin/python tools/bench_vllm.py [--enforce-eager] [--kv-cache-gib 1]
"""

import argparse
import os
import time

import jax
import numpy as np
from flax import nnx

from locoexp.model.config import ModelConfig
from locoexp.model.transformer import build_model
from locoexp.rollout.build import build_engine
from locoexp.rollout.config import EngineKind, RolloutConfig, SamplingParams

W1 = ModelConfig(
    name="w1",
    vocab_size=151_936,
    num_layers=4,
    hidden_dim=256,
    mlp_dim=768,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    rope_theta=1e6,
    tie_embeddings=True,
)
PROMPTS, GENERATIONS, PROMPT_TOKENS, NEW_TOKENS = 8, 8, 64, 64


def measure(engine, params, prompts, repeats: int) -> dict[str, float]:
    sampling = SamplingParams(temperature=1.0, ignore_eos=True)
    generate = lambda seed: engine.generate(
        prompts, key=jax.random.key(seed), max_new_tokens=NEW_TOKENS, sampling=sampling
    )
    generate(0)  # warm-up: compiles the programs / captures the graphs
    start = time.perf_counter()
    for r in range(repeats):
        rollout = generate(1 + r)
    seconds = (time.perf_counter() - start) / repeats
    assert (rollout.lengths == NEW_TOKENS).all()
    publish = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.load_weights(params)
        jax.block_until_ready(engine.params)
        publish.append(time.perf_counter() - start)
    return {
        "tokens_per_s": len(prompts) * NEW_TOKENS / seconds,
        "generate_s": seconds,
        "publish_s": float(np.median(publish)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model = build_model(W1, seed=0)
    params = nnx.state(model, nnx.Param)
    rng = np.random.default_rng(0)
    prompts = [
        p
        for p in rng.integers(16, W1.vocab_size, (PROMPTS, PROMPT_TOKENS), dtype=np.int32)
        for _ in range(GENERATIONS)
    ]
    configs = {
        "jax": RolloutConfig(engine=EngineKind.jax),
        "vllm": RolloutConfig(
            engine=EngineKind.vllm, kv_cache_gib=args.kv_cache_gib, enforce_eager=args.enforce_eager
        ),
    }
    results = {}
    for name, config in configs.items():
        start = time.perf_counter()
        engine = build_engine(
            model,
            config,
            eos_id=0,
            pad_id=0,
            devices=jax.local_devices(),
            max_sequence_tokens=PROMPT_TOKENS + NEW_TOKENS,
        )
        start_s = time.perf_counter() - start
        results[name] = {"start_s": start_s, **measure(engine, params, prompts, args.repeats)}
        del engine
    platform = jax.devices()[0].platform
    print(
        f"W1 rollout on {platform} ({os.cpu_count()} cores), {PROMPTS}x{GENERATIONS} sequences, "
        f"{PROMPT_TOKENS} prompt + {NEW_TOKENS} forced new tokens, fp32"
        f"{', vLLM eager' if args.enforce_eager else ''}"
    )
    print(f"{'engine':8}{'tokens/s':>12}{'generate s':>12}{'publish s':>12}{'start s':>10}")
    for name, r in results.items():
        print(
            f"{name:8}{r['tokens_per_s']:12.1f}{r['generate_s']:12.3f}{r['publish_s']:12.4f}"
            f"{r['start_s']:10.1f}"
        )


if __name__ == "__main__":
    main()
