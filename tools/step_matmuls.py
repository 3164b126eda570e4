"""A step's matmuls at their own shapes, the rate this machine reaches at each, and the floors.

A square matmul's rate is not every matmul's limit. The decode head [64, 256] x [256, 151,936]
streams a 155 MB weight for 5 GFLOP (about 32 FLOPs per byte): bandwidth-bound, where a
2048^3 matmul is compute-bound. So `tools/bench_w1.py` reports each floor twice: FLOPs over the
best square-matmul rate (the roofline), and the sum over the part's matmuls of FLOPs over the
best rate XLA (jit) or NumPy reaches at that matmul's own shape, measured here. XLA is timed
twice: writing the product, and with the product reduced in the same program (a fused consumer:
the [m, n] result never reaches memory, as in the trainer's fused head). A write-bound shape
such as [20,480, 256] x [256, 768] reaches twice the rate without the write, and a floor timed
only with it was beaten by the step it bounds (Table 1's caps: 0.90x, experiments/LOG.md,
session 10).

Each part of a step is a list of `Term`s: a shape and the FLOPs the part spends at that shape
(2 per multiply-add; attention counts only the causal half it needs): the one FLOP count of a
step that tools/bench_w1.py and tools/bench_table1_caps.py report. Shapes follow the model
code: separate q/k/v/o projections and a SwiGLU MLP (`model.sizes.block_projections`),
grouped-query attention as the einsum `btkrh,bskh->bkrts` (batch = sequences x KV heads,
m = tokens x query heads per KV head), the trainer's fused head in chunks (`trainer/head.py`:
logits, dh and dW per chunk). Backward of x @ W is dx = dy @ W^T and dW = x^T @ dy. The decode
attention is measured at the mid context (its FLOPs are < 1% of a decode step). Norms, RoPE,
softmax and sampling are not matmuls and are not counted.

This module owns shapes and rates; it knows nothing of runners or timings (bench_w1 does).
Shapes: n sequences, P prompt, M new tokens, R rows, L row tokens, K loss slots, C head chunk,
D width, F MLP width, V vocabulary.
"""

import dataclasses
import time
from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from locoexp.model.config import ModelConfig
from locoexp.model.sizes import block_projections


@dataclasses.dataclass(frozen=True, order=True)
class Shape:
    """A (batched) matmul [batch x] [m, k] x [k, n]."""

    m: int
    k: int
    n: int
    batch: int = 1

    def __str__(self) -> str:
        lead = f"{self.batch} x " if self.batch > 1 else ""
        return f"{lead}[{self.m},{self.k}]x[{self.k},{self.n}]"

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n


Term = tuple[Shape, float]  # a shape and the FLOPs a part spends at it


def body_terms(m: ModelConfig, tokens: int, *, forward=True, backward=False) -> list[Term]:
    """The blocks' projections over `tokens` rows: x @ W, and dx = dy @ W^T, dW = x^T @ dy."""
    terms = []
    for d_in, d_out in block_projections(m):
        flops = m.num_layers * 2 * tokens * d_in * d_out
        if forward:
            terms.append((Shape(tokens, d_in, d_out), flops))
        if backward:
            terms += [(Shape(tokens, d_out, d_in), flops), (Shape(d_in, tokens, d_out), flops)]
    return terms


def attention_terms(
    m: ModelConfig, *, sequences: int, queries: int, context: int, flops: float, backward=False
) -> list[Term]:
    """QK^T and PV (half of `flops` each, the forward's causal count), and for the backward
    dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q at the same per-term FLOPs."""
    b, rq, h = sequences * m.num_kv_heads, queries * (m.num_heads // m.num_kv_heads), m.head_dim
    scores, values = Shape(rq, h, context, b), Shape(rq, context, h, b)
    terms = [(scores, flops / 2), (values, flops / 2)]
    if backward:
        transposed = Shape(context, rq, h, b)  # P^T dO and dS^T Q
        terms += [(scores, flops / 2), (transposed, flops / 2)]
        terms += [(values, flops / 2), (transposed, flops / 2)]
    return terms


def causal_attention_flops(m: ModelConfig, *, sequences: int, length: int, start: int = 0) -> int:
    """QK^T + PV of query tokens start..length-1, each over the keys up to itself, all layers."""
    per_key = m.num_layers * 2 * 2 * m.num_heads * m.head_dim
    return sequences * per_key * sum(i + 1 for i in range(start, length))


def head_terms(m: ModelConfig, rows: int, count: int = 1) -> list[Term]:
    """`count` output-head matmuls [rows, D] x [D, V]."""
    return [
        (Shape(rows, m.hidden_dim, m.vocab_size), count * 2 * rows * m.hidden_dim * m.vocab_size)
    ]


def fused_head_terms(m: ModelConfig, slots: int, chunk: int, *, backward: bool) -> list[Term]:
    """The trainer's head on K slots in chunks of C: logits [C,D]x[D,V]; with the backward also
    dh from exp(logits) @ W [C,V]x[V,D] and dW from exp(logits)^T @ h [V,C]x[C,D] (the softmax's
    row scale and the one-hot term are applied on the [C, D] side: `trainer/head.py`)."""
    c, d, v = min(chunk, slots), m.hidden_dim, m.vocab_size
    flops = 2 * slots * d * v
    terms = [(Shape(c, d, v), flops)]
    if backward:
        terms += [(Shape(c, v, d), flops), (Shape(v, c, d), flops)]
    return terms


def rollout_parts(m: ModelConfig, *, sequences: int, prompt: int, new: int) -> dict[str, list]:
    """Prefill (body on n x P tokens, causal attention, head on the last token) and decode
    (M - 1 iterations of body + head on n rows, attention over the cache)."""
    n, p = sequences, prompt
    prefill = body_terms(m, n * p) + head_terms(m, n)
    prefill += attention_terms(
        m, sequences=n, queries=p, context=p, flops=causal_attention_flops(m, sequences=n, length=p)
    )
    iterations, mid = new - 1, p + new // 2
    decode_attention = causal_attention_flops(m, sequences=n, length=p + new - 1, start=p)
    body_once = body_terms(m, n)
    decode = [(s, f * iterations) for s, f in body_once] + head_terms(m, n, iterations)
    decode += attention_terms(m, sequences=n, queries=1, context=mid, flops=decode_attention)
    at_32 = causal_attention_flops(m, sequences=n, length=p + 32, start=p + 31)  # 1 query
    one_body = body_once + attention_terms(m, sequences=n, queries=1, context=p + 32, flops=at_32)
    return {
        "rollout": prefill + decode,
        "prefill": prefill,
        "decode": decode,
        "decode_body_once": one_body,
        "decode_head_once": head_terms(m, n),
    }


def train_parts(
    m: ModelConfig, *, rows: int, row_tokens: int, sequences: int, sequence_tokens: int,
    slots: int, chunk: int,
) -> dict[str, list]:  # fmt: skip
    """The train step: body and attention forward + backward over R x L row tokens (one
    sequence's causal attention per packed sequence), the fused head on the K loss slots."""
    tokens = rows * row_tokens
    attention = dict(
        sequences=sequences,
        queries=sequence_tokens,
        context=sequence_tokens,
        flops=causal_attention_flops(m, sequences=sequences, length=sequence_tokens),
    )
    body_fwd = body_terms(m, tokens) + attention_terms(m, **attention)
    body_bwd = body_terms(m, tokens, forward=False, backward=True)
    body_bwd += attention_terms(m, **attention, backward=True)[2:]
    head_fwd = fused_head_terms(m, slots, chunk, backward=False)
    head_bwd = fused_head_terms(m, slots, chunk, backward=True)[1:]
    return {
        "train_step": body_fwd + body_bwd + head_fwd + head_bwd,
        "forward": body_fwd + head_fwd,
        "forward_body": body_fwd,
        "forward_head": head_fwd,
        "backward": body_bwd + head_bwd,
    }


def _fastest_seconds(fn: Callable[[], object], repeats: int, budget_s: float = 0.3) -> float:
    """The fastest of at least `repeats` timed calls after two warm-up calls (more, up to 50, for
    calls shorter than `budget_s` / repeats). On a shared machine a call's time is its own cost
    plus whatever other processes took meanwhile, so the fastest is the best estimate of the
    rate this shape reaches, which is what a floor needs."""
    fn(), fn()  # compile / warm caches
    times = []
    while len(times) < repeats or (sum(times) < budget_s and len(times) < 50):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _reduced_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b consumed in the same program by a max over its rows: XLA can fuse the reduction
    into the matmul, so the [m, n] product need never be written to memory."""
    return jnp.max(a @ b, axis=-2)


def measure_shape(shape: Shape, repeats: int, seed: int = 0) -> dict:
    """fp32 GFLOP/s at `shape`, the fastest of the timed calls, three ways: XLA (jit) writing the
    product, XLA with the product reduced in the same program ("xla_fused": a step whose
    consumer is fused into the matmul, as the trainer's head is, never writes it, and a floor
    must not be beaten by the step it bounds) and NumPy. The best of the three is the rate."""
    rng = np.random.default_rng(seed)
    lead = (shape.batch,) if shape.batch > 1 else ()
    a = rng.standard_normal((*lead, shape.m, shape.k), np.float32)
    b = rng.standard_normal((*lead, shape.k, shape.n), np.float32)
    a_dev, b_dev = jnp.asarray(a), jnp.asarray(b)
    xla, fused = jax.jit(jnp.matmul), jax.jit(_reduced_matmul)
    seconds = {
        "xla": _fastest_seconds(lambda: xla(a_dev, b_dev).block_until_ready(), repeats),
        "xla_fused": _fastest_seconds(lambda: fused(a_dev, b_dev).block_until_ready(), repeats),
        "numpy": _fastest_seconds(lambda: np.matmul(a, b), repeats),
    }
    rates = {k: shape.flops / s / 1e9 for k, s in seconds.items()}
    best = max(rates, key=rates.get)
    return {"shape": str(shape), **{f"{k}_gflops": r for k, r in rates.items()}, "best": best,
            "gflops": rates[best]}  # fmt: skip


def measure_shapes(parts: Iterable[list[Term]], repeats: int) -> dict[Shape, dict]:
    """The rate at every distinct shape the parts use."""
    shapes = sorted({shape for terms in parts for shape, _ in terms})
    return {shape: measure_shape(shape, repeats) for shape in shapes}


def shaped_floor_s(terms: list[Term], rates: dict[Shape, dict]) -> float:
    """Sum over the part's matmuls of FLOPs / the best rate at their shape, in seconds."""
    return sum(flops / (rates[shape]["gflops"] * 1e9) for shape, flops in terms)


def total_flops(terms: list[Term]) -> float:
    return sum(flops for _, flops in terms)
