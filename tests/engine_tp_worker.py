"""Run in a subprocess by tests/test_engine_tp.py, with 4 CPU devices set before jax starts:
TP1 on one device, then DP2 x TP2 and DP1 x TP4 engines over the four devices, on the same
prompts (DP2 x TP2 holds data parallelism; a DP4 x TP1 engine added its compiles and no path).
Writes each engine's greedy and sampled rollouts and the logits of a cached forward pass with
its sharded weights and cache to an .npz file (argument 1); then a bf16 TP2 engine of the fp32
weights before and after a publication; then continuous batching with compaction on DP2 x TP2
beside static waves, and what its compiled slot programs exchange between devices."""

import dataclasses
import functools
import os
import re
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from tiny_policy import PAD, TINY, random_prompts, tiny_model  # noqa: E402

from locoexp.model.config import DType  # noqa: E402
from locoexp.model.transformer import build_model, init_cache  # noqa: E402
from locoexp.rollout import sharding  # noqa: E402
from locoexp.rollout.config import RolloutConfig, SamplingParams, Scheduler  # noqa: E402
from locoexp.rollout.engine import JaxEngine  # noqa: E402

MAX_NEW = 12
LAYOUTS = {"tp1_1dev": (1, 1), "tp2": (2, 4), "tp4": (4, 4)}


def cached_logits(engine: JaxEngine, sequences: np.ndarray) -> np.ndarray:
    """Logits [rows, T, V] of a prefill over the whole sequences with the engine's sharded
    weights, its cache layout and its mesh (the program XLA partitions as the engine's)."""
    rows, length = sequences.shape
    cache_sharding = sharding.cache_sharding(engine.mesh)

    @jax.jit
    def forward(params, tokens):
        model = nnx.merge(engine.graphdef, params)
        cache = init_cache(model.config, rows, length, heads=engine._cache_heads)
        cache = jax.lax.with_sharding_constraint(cache, cache_sharding)
        positions = jnp.broadcast_to(jnp.arange(length), (rows, length))
        valid = jnp.ones((rows, length), bool)
        hidden, _ = model(tokens, positions, valid, cache, 0)
        return model.logits(hidden)

    return np.asarray(forward(engine.params, jax.device_put(sequences, engine._rows)))


def main(path: str) -> None:
    model = tiny_model(seed=0)
    prompts = random_prompts((3, 5, 9, 4, 7, 2, 6, 8), seed=1)
    sequences = np.stack(random_prompts([16] * 8, seed=2))
    out = {}
    for name, (tp, devices) in LAYOUTS.items():
        config = RolloutConfig(tensor_parallel=tp, prompt_bucket_tokens=1, capacity=4)
        engine = JaxEngine(model, config, eos_id=-1, pad_id=PAD, devices=jax.devices()[:devices])
        kernel = engine.params["layers"][0]["mlp"]["up_proj"]["kernel"][...]
        out[f"{name}_up_proj_shard_columns"] = kernel.addressable_shards[0].data.shape[1]
        for label, rollout in greedy_and_sampled(engine, prompts):
            out[f"{name}_{label}_tokens"] = rollout.tokens
            out[f"{name}_{label}_logprobs"] = rollout.logprobs
            out[f"{name}_{label}_waves"] = rollout.waves
        out[f"{name}_logits"] = cached_logits(engine, sequences)
    out.update(static_waves(model, prompts))
    out.update(bf16_republished(model, prompts))
    out.update(compacted_on_replicas(model))
    out.update(vocabulary_parallel())
    np.savez(path, **out)


def greedy_and_sampled(engine: JaxEngine, prompts):
    """(label, rollout) of a greedy and a seeded temperature-1 generation."""
    for label, sampling, seed in (
        ("greedy", SamplingParams(temperature=0.0), 0),
        ("sampled", SamplingParams(temperature=1.0), 3),
    ):
        yield (
            label,
            engine.generate(
                prompts, key=jax.random.key(seed), max_new_tokens=MAX_NEW, sampling=sampling
            ),
        )


def static_waves(model, prompts) -> dict:
    """Static waves (rollout.scheduler=waves) on TP2 x DP2, to set beside the default continuous
    batching of the same layout: the same completions request by request."""
    out = {}
    for name in ("tp2",):
        tp, devices = LAYOUTS[name]
        config = RolloutConfig(
            tensor_parallel=tp, prompt_bucket_tokens=1, capacity=4, scheduler=Scheduler.waves
        )
        engine = JaxEngine(model, config, eos_id=-1, pad_id=PAD, devices=jax.devices()[:devices])
        for label, rollout in greedy_and_sampled(engine, prompts):
            out[f"waves_{name}_{label}_tokens"] = rollout.tokens
    return out


def bf16_republished(model, prompts) -> dict:
    """A bf16 TP2 engine of fp32 weights, before and after republishing the same weights: the
    cast lands on the layout its compiled programs take, and changes nothing."""
    config = RolloutConfig(tensor_parallel=2, prompt_bucket_tokens=1, param_dtype=DType.bfloat16)
    engine = JaxEngine(model, config, eos_id=-1, pad_id=PAD, devices=jax.devices())
    out = {}
    for label in ("bf16_started", "bf16_republished"):
        rollout = engine.generate(
            prompts, key=jax.random.key(3), max_new_tokens=MAX_NEW, sampling=SamplingParams(1.0)
        )
        out[f"{label}_tokens"], out[f"{label}_logprobs"] = rollout.tokens, rollout.logprobs
        engine.load_weights(nnx.state(model, nnx.Param))
    out["bf16_dtypes"] = np.array(sorted({str(x.dtype) for x in jax.tree.leaves(engine.params)}))
    return out


# a collective of the compiled HLO and its result's shapes ("f32[2,1,16,8]" or a tuple of them)
COLLECTIVE = re.compile(
    r"= (.+?) (all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)(-start)?\("
)


def cache_collectives(compiled, *, head_dim: int, prompt_len: int) -> int:
    """Collectives of a compiled program that carry a KV-cache-shaped array: [rows, heads,
    slots, head_dim] with at least a prompt's slots (a sampler's [rows, 1, 1, block] is not)."""
    found = 0
    for line in compiled.as_text().splitlines():
        match = COLLECTIVE.search(line)
        shapes = re.findall(r"\[([0-9,]*)\]", match.group(1)) if match else []
        dims = [[int(d) for d in shape.split(",")] for shape in shapes if shape]
        found += any(len(d) == 4 and d[3] == head_dim and d[2] >= prompt_len for d in dims)
    return found


def compacted_on_replicas(model) -> dict:
    """32 requests of forced, uneven lengths through 16 slots of DP2 x TP2 (widths 16 and 8):
    refilled, then compacted 16 -> 8. Continuous batching's completions beside static waves',
    and, for each compiled `run` (with refill) and `compact`, the collectives carrying a
    cache-shaped array (the prompts are padded to 16 slots) and the compaction's temporaries
    beside the narrower cache it makes."""
    prompts = random_prompts(np.random.default_rng(5).integers(2, 10, 32), seed=6)
    caps = np.random.default_rng(7).integers(1, 2 * MAX_NEW, 32)
    forced = SamplingParams(temperature=1.0, ignore_eos=True)
    out = {}
    for scheduler in Scheduler:
        config = RolloutConfig(
            tensor_parallel=2, prompt_bucket_tokens=1, capacity=16, scheduler=scheduler
        )
        engine = JaxEngine(model, config, eos_id=-1, pad_id=PAD, devices=jax.devices())
        rollout = engine.generate(
            prompts, key=jax.random.key(8), max_new_tokens=2 * MAX_NEW, sampling=forced,
            request_caps=caps,
        )  # fmt: skip
        out[f"replicas_{scheduler.value}_tokens"] = rollout.tokens
        out[f"replicas_{scheduler.value}_lengths"] = rollout.lengths
    out["replicas_caps"] = caps
    out["replicas_refills"] = rollout.refills
    compiled = engine._slots._compiled  # the continuous engine's, by (kind, static)
    run = [c for (kind, static), c in compiled.items() if kind == "run" and static[4]]
    compact = [c for (kind, _), c in compiled.items() if kind == "compact"]
    out["replicas_programs"] = np.array([len(run), len(compact)])
    count = functools.partial(cache_collectives, head_dim=model.config.head_dim, prompt_len=16)
    out["replicas_run_cache_collectives"] = np.array([count(c) for c in run])
    out["replicas_compact_cache_collectives"] = np.array([count(c) for c in compact])
    out["replicas_compact_temp_bytes"] = np.array(
        [c.memory_analysis().temp_size_in_bytes for c in compact]
    )
    # the narrower (8-slot) cache on one device: 4 rows x 1 head x S slots x h, K and V, layers
    narrow = init_cache(model.config, 4, 16 + 2 * MAX_NEW, heads=1)
    out["replicas_narrow_cache_bytes"] = sum(x.nbytes for x in jax.tree.leaves(narrow))
    return out


def logits_collectives(compiled, vocab: int) -> int:
    """Collectives of a compiled program that carry an array with a vocabulary-sized axis."""
    found = 0
    for line in compiled.as_text().splitlines():
        match = COLLECTIVE.search(line)
        shapes = re.findall(r"\[([0-9,]*)\]", match.group(1)) if match else []
        found += any(vocab in map(int, filter(None, shape.split(","))) for shape in shapes)
    return found


VOCAB_SAMPLERS = {  # greedy's argmax and log-softmax are plain reductions over V
    "full": SamplingParams(temperature=1.0),
    "top_p": SamplingParams(temperature=1.0, top_p=0.8),
}


def vocabulary_parallel() -> dict:
    """A 1,024-token vocabulary at TP4 (split by vocabulary over the 4 devices) and TP1: each
    device's rows of the embedding, each sampler's tokens on both, and the TP4 programs'
    collectives that carry a vocabulary-sized array."""
    model = build_model(dataclasses.replace(TINY, vocab_size=1024), seed=0)
    prompts = random_prompts((3, 5, 9, 4, 7, 2, 6, 8), seed=9, vocab=1024)
    out = {}
    # TP1 draws only top-p's reference: TP2 and TP4 equal TP1 for greedy and the exact sampler on
    # TINY's 32-token vocabulary, split by vocabulary too (test_tensor_parallel_engine_equals_tp1)
    for tp, devices, labels in (
        (4, jax.devices(), VOCAB_SAMPLERS),
        (1, jax.devices()[:1], ["top_p"]),
    ):
        config = RolloutConfig(tensor_parallel=tp, prompt_bucket_tokens=1)
        engine = JaxEngine(model, config, eos_id=-1, pad_id=PAD, devices=devices)
        rows = engine.params["embed"]["embedding"][...].addressable_shards[0].data.shape[0]
        out[f"vocab_tp{tp}_embedding_rows"] = rows
        for label in labels:
            sampling = VOCAB_SAMPLERS[label]
            rollout = engine.generate(
                prompts, key=jax.random.key(10), max_new_tokens=6, sampling=sampling
            )
            out[f"vocab_tp{tp}_{label}_tokens"] = rollout.tokens
            out[f"vocab_tp{tp}_{label}_logits_collectives"] = sum(
                logits_collectives(c, 1024)
                for (kind, static), c in engine._slots._compiled.items()
                if static[0].sampling == sampling
            )
    return out


if __name__ == "__main__":
    main(sys.argv[1])
