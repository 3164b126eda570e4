"""Causal self-attention over packed training rows, one kernel per `AttentionKind`.

The train step attends within each packed sequence (same segment id, not in the future), never
across sequences or from padding (segment 0). `attend` dispatches on the kind; every kernel takes
q [B, T, K*R, h], k and v [B, T, K, h] and the segment ids [B, T] and returns [B, T, K*R, h].
Only `dense` forms [B, K, R, T, T] scores; `blockwise` keeps [B, K, R*Q, C] tiles of one block
pair at a time (forward and backward), so its memory grows linearly with T.

It owns the attention numerics of full rows only: it never sees a KV cache (the engine path in
`transformer.py`) or a loss, and a mesh only as the trainer's row layout (`AttentionSpec.rows`:
activations pinned to it, and a Pallas TPU kernel run on each device's own rows). Padding
queries (segment 0) attend to nothing: `dense` gives them uniform weights, the other kernels
zeros; neither reaches a loss.

Shapes: B rows, T tokens, K KV heads, R query heads per KV head, h head_dim, Q = C block tokens,
n blocks per row.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from locoexp.model.config import ATTENTION_BLOCK_TOKENS, AttentionKind, attention_block

Array = jax.Array

_MASKED = -1e30  # finite so that fully masked (padding) rows give uniform, not NaN, weights
_einsum32 = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """The trainer's choice of kernel (`trainer.attention`, `trainer.attention_block_tokens`)."""

    kind: AttentionKind = AttentionKind.dense
    block_tokens: int = ATTENTION_BLOCK_TOKENS
    # Sliding-window attention (Gemma4's local layers): a query attends only to the keys less
    # than `window` tokens behind it (HF's sliding_window); 0 = the whole causal past.
    window: int = 0
    # How the trainer lays packed rows over its devices: a sharding of the row axis alone
    # (`jax.sharding.NamedSharding` of a 1-D [B] array), or None (one device, or the caller's
    # own). The packed forward pins every [B, ...] activation to it (`constrain_rows`).
    rows: jax.sharding.NamedSharding | None = None


def constrain_rows(spec: AttentionSpec | None, x: Array) -> Array:
    """x [B, ...] held as `spec.rows` lays the rows (dim 0) over the devices, every other
    dimension whole on each device: FSDP's activations. Without it the partitioner may carry a
    weight's sharding into the activations (Shardy picked [1, 2, 2, 1] tiles of the attention's
    [B, K, R*Q, C] blocks from the FSDP-sharded projections of a 64-wide model on 4 devices) and
    then replicate whole tensors inside the attention's backward loop to get back ("Involuntary
    full rematerialization")."""
    if spec is None or spec.rows is None:
        return x
    return jax.lax.with_sharding_constraint(x, spec.rows)  # the 1-D spec: dims past 0 whole


def on_own_rows(spec: AttentionSpec, kernel):
    """`kernel(q, k, v, segment_ids)` run by each device on its own rows of `spec.rows`
    (`jax.shard_map`; the kernel itself when there is no row layout). XLA cannot partition a
    Mosaic (Pallas TPU) kernel ("Mosaic kernels cannot be automatically partitioned. Please wrap
    the call in a shard_map."), so splash failed to compile on more than one chip; rows attend
    only within themselves, so the per-device call needs no communication."""
    if spec.rows is None:
        return kernel
    rows = spec.rows.spec
    return jax.shard_map(
        kernel, mesh=spec.rows.mesh, in_specs=(rows,) * 4, out_specs=rows, check_vma=False
    )


def causal_segment_mask(segment_ids: Array, window: int = 0) -> Array:
    """[B,T] segment ids (0 = padding) -> [B,T,T] mask: same segment and not in the future (and
    fewer than `window` tokens back when window > 0)."""
    t = segment_ids.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    if window:
        causal = causal & ~jnp.tril(jnp.ones((t, t), bool), -window)
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return same & causal & (segment_ids[:, :, None] > 0)


def attend(spec: AttentionSpec, q: Array, k: Array, v: Array, segment_ids: Array) -> Array:
    """Causal, segment-masked attention of packed rows with the kernel `spec.kind`."""
    match spec.kind:
        case AttentionKind.dense:
            return dense_attention(q, k, v, segment_ids, spec.window)
        case AttentionKind.blockwise:
            return blockwise_attention(q, k, v, segment_ids, spec.block_tokens, spec.window)
        case AttentionKind.splash:
            splash = functools.partial(splash_attention, interpret=False, window=spec.window)
            return on_own_rows(spec, splash)(q, k, v, segment_ids)
        case AttentionKind.cudnn:
            return cudnn_attention(q, k, v, segment_ids, spec.window)


def _grouped(q: Array, kv_heads: int) -> Array:
    """q [B, T, K*R, h] -> [B, T, K, R, h] (query head j reads KV head j // R)."""
    b, t, heads, h = q.shape
    return q.reshape(b, t, kv_heads, heads // kv_heads, h)


def dense_attention(q: Array, k: Array, v: Array, segment_ids: Array, window: int = 0) -> Array:
    """The reference: [B, K, R, T, T] scores under the [B, T, T] causal segment mask."""
    b, t, heads, h = q.shape
    mask = causal_segment_mask(segment_ids, window)
    scores = jnp.einsum(
        "btkrh,bskh->bkrts", _grouped(q, k.shape[2]), k, preferred_element_type=jnp.float32
    )
    scores = jnp.where(mask[:, None, None], scores * (h**-0.5), _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkrts,bskh->btkrh", probs, v).reshape(b, t, heads, h)


# ---- blockwise: online softmax (flash attention) in plain JAX -------------------------------
#
# Each row is cut into n blocks of Q tokens. Query heads sharing a KV head are stacked into the
# row dimension of one matmul ([B, K, R*Q, h] x [B, K, C, h]), so every block-pair product is a
# plain matmul batched over the rows and KV heads, with no transposed copies inside the loops.
# All rows run together: a block pair is skipped (`lax.cond`) when no row has an allowed (same
# segment, causal) entry in it, so blocks above the diagonal and blocks that are padding in
# every row are never computed. Batching the rows gives each small block-pair matmul B times the
# work, which on CPU beat running rows one after another with exact per-row skipping
# (experiments/LOG.md, session 8). A row is cut into the fewest equal blocks of at most
# `trainer.attention_block_tokens` (`attention_block`; the default's measurements are in
# trainer/config.py).


def _blocks(x: Array, size: int) -> Array:
    """[B, T, ...] -> [n, B, size, ...], padding T to a multiple of `size` with zeros (padding
    segment ids are 0, so padded keys are never attended)."""
    b, t = x.shape[:2]
    n = -(-t // size)
    x = jnp.pad(x, [(0, 0), (0, n * size - t)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(b, n, size, *x.shape[2:]), 1, 0)


def _heads_major(x: Array, kv_heads: int) -> Array:
    """Query-like [n, B, Q, K*R, h] -> [n, B, K, R*Q, h] (row r*Q + q is head r of token q)."""
    n, b, size, heads, h = x.shape
    x = x.reshape(n, b, size, kv_heads, heads // kv_heads, h).transpose(0, 1, 3, 4, 2, 5)
    return x.reshape(n, b, kv_heads, heads // kv_heads * size, h)


def _token_major(x: Array, heads: int, t: int) -> Array:
    """Inverse of `_heads_major` and `_blocks`: [n, B, K, R*Q, h] -> [B, T, K*R, h]."""
    n, b, kv_heads, rows, h = x.shape
    size = rows // (heads // kv_heads)
    x = x.reshape(n, b, kv_heads, heads // kv_heads, size, h).transpose(1, 0, 4, 2, 3, 5)
    return x.reshape(b, n * size, heads, h)[:, :t]


def _kv_major(x: Array) -> Array:
    """Key-like [n, B, C, K, h] -> [n, B, K, C, h] (its own inverse)."""
    return x.transpose(0, 1, 3, 2, 4)


def _allowed(seg_q: Array, seg_k: Array, i, j, window: int) -> Array:
    """[B, Q] x [B, C] segment ids of query block i and key block j -> [B, Q, C] mask (a pair
    wholly outside the window has no allowed entry, so it is skipped like a future pair)."""
    size = seg_q.shape[-1]
    offsets = jnp.arange(size)
    behind = (i * size + offsets)[:, None] - (j * size + offsets)[None, :]
    causal = (behind >= 0) & (behind < window) if window else behind >= 0
    same = seg_q[:, :, None] == seg_k[:, None, :]
    return same & causal & (seg_q[:, :, None] > 0)


def _masked(allowed: Array, x: Array, fill: float) -> Array:
    """x [B, K, R*Q, C] with `fill` where the [B, Q, C] mask is False (for every head)."""
    b, kv_heads, rows, c = x.shape
    q = allowed.shape[1]
    x = x.reshape(b, kv_heads, rows // q, q, c)
    return jnp.where(allowed[:, None, None], x, fill).reshape(b, kv_heads, rows, c)


def _if_any(allowed: Array, visit, carry):
    """visit(carry) where the block pair has an allowed entry; the carry unchanged where not."""
    return jax.lax.cond(allowed.any(), visit, lambda c: c, carry)


def _flash_forward(q, k, v, seg, window):
    """Blocks (q [n, B, K, R*Q, h] scaled by 1/sqrt(h), k and v [n, B, K, C, h], seg [n, B, Q])
    -> out [n, B, K, R*Q, h] and log-sum-exps [n, B, K, R*Q] (0 where nothing is attended)."""

    def query_block(i):
        qi = q[i]

        def key_block(j, carry):
            allowed = _allowed(seg[i], seg[j], i, j, window)

            def visit(carry):
                top, total, acc = carry  # [B, K, R*Q] x2, [B, K, R*Q, h]
                scores = _masked(allowed, _einsum32("bkxh,bkch->bkxc", qi, k[j]), -jnp.inf)
                new_top = jnp.maximum(top, scores.max(-1))
                probs = jnp.exp(scores - new_top[..., None])
                decay = jnp.exp(top - new_top)
                pv = _einsum32("bkxc,bkch->bkxh", probs.astype(v.dtype), v[j])
                return new_top, decay * total + probs.sum(-1), acc * decay[..., None] + pv

            return _if_any(allowed, visit, carry)

        rows = qi.shape[:-1]
        init = (
            jnp.full(rows, _MASKED, jnp.float32),
            jnp.zeros(rows, jnp.float32),
            jnp.zeros(qi.shape, jnp.float32),
        )
        top, total, acc = jax.lax.fori_loop(0, i + 1, key_block, init)  # causal: keys <= i
        seen = total > 0
        lse = jnp.where(seen, top + jnp.log(jnp.where(seen, total, 1.0)), 0.0)
        inverse = jnp.where(seen, 1.0 / jnp.where(seen, total, 1.0), 0.0)
        return (acc * inverse[..., None]).astype(q.dtype), lse

    return jax.lax.map(query_block, jnp.arange(q.shape[0]))


def _flash_backward(q, k, v, seg, out, lse, dout, window):
    """dq (by the scaled q), dk, dv blocks from the forward's out and log-sum-exps, recomputing
    each block pair's probabilities (FlashAttention-2's backward): no [T, T] array is formed."""
    n = q.shape[0]
    delta = (dout.astype(jnp.float32) * out.astype(jnp.float32)).sum(-1)  # [n, B, K, R*Q]

    def key_block(dq, j):
        kj, vj = k[j], v[j]

        def query_block(i, carry):
            allowed = _allowed(seg[i], seg[j], i, j, window)

            def visit(carry):
                dk, dv, dq = carry
                qi, doi = q[i], dout[i]
                scores = _einsum32("bkxh,bkch->bkxc", qi, kj)
                probs = _masked(allowed, jnp.exp(scores - lse[i][..., None]), 0.0)
                dv = dv + _einsum32("bkxc,bkxh->bkch", probs, doi)
                dscores = probs * (_einsum32("bkxh,bkch->bkxc", doi, vj) - delta[i][..., None])
                dq_i = _einsum32("bkxc,bkch->bkxh", dscores, kj)
                dq = jax.lax.dynamic_update_index_in_dim(dq, dq[i] + dq_i, i, 0)
                return dk + _einsum32("bkxc,bkxh->bkch", dscores, qi), dv, dq

            return _if_any(allowed, visit, carry)

        zeros = jnp.zeros(kj.shape, jnp.float32)
        dk, dv, dq = jax.lax.fori_loop(j, n, query_block, (zeros, zeros, dq))  # causal: i >= j
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(key_block, jnp.zeros(q.shape, jnp.float32), jnp.arange(n))
    return dq, dk, dv


def _blocked_inputs(q, k, v, segment_ids, block_tokens):
    """q [B, T, K*R, h], k, v [B, T, K, h], seg [B, T] in blocks (q scaled by 1/sqrt(h))."""
    size = attention_block(q.shape[1], block_tokens)
    kv_heads, scale = k.shape[2], q.shape[-1] ** -0.5
    qb = _heads_major(_blocks(q * jnp.asarray(scale, q.dtype), size), kv_heads)
    kb, vb = (_kv_major(_blocks(x, size)) for x in (k, v))
    return qb, kb, vb, _blocks(segment_ids, size)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def blockwise_attention(
    q: Array, k: Array, v: Array, segment_ids: Array, block_tokens: int, window: int = 0
):
    """Flash-attention-style attention in blocks of `block_tokens` (both directions); memory is
    O(T) per row plus one block pair's [B, K, R*Q, C] tiles."""
    out, _ = _blockwise_fwd(q, k, v, segment_ids, block_tokens, window)
    return out


def _blockwise_fwd(q, k, v, segment_ids, block_tokens, window=0):
    out, lse = _flash_forward(*_blocked_inputs(q, k, v, segment_ids, block_tokens), window)
    result = _token_major(out, q.shape[2], q.shape[1])
    return result, (q, k, v, segment_ids, out, lse)


def _blockwise_bwd(block_tokens, window, residuals, dout):
    q, k, v, segment_ids, out, lse = residuals
    qb, kb, vb, sb = _blocked_inputs(q, k, v, segment_ids, block_tokens)
    size = attention_block(q.shape[1], block_tokens)
    dout_b = _heads_major(_blocks(dout, size), k.shape[2])
    dq, dk, dv = _flash_backward(qb, kb, vb, sb, out, lse, dout_b, window)
    b, t, scale = q.shape[0], q.shape[1], q.shape[-1] ** -0.5
    dk, dv = (_kv_major(x).swapaxes(0, 1).reshape(b, -1, *k.shape[2:])[:, :t] for x in (dk, dv))
    dq = _token_major(dq, q.shape[2], t) * scale
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


blockwise_attention.defvjp(_blockwise_fwd, _blockwise_bwd)


# ---- backend kernels -------------------------------------------------------------------------


def splash_attention(
    q: Array, k: Array, v: Array, segment_ids: Array, *, interpret: bool, window: int = 0
):
    """JAX's Pallas splash-attention kernel (TPU; `interpret=True` runs it anywhere, slowly).
    The kernel takes one row of [heads, T, h] and the scale folded into q; rows are vmapped."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as kernel_lib,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as mask_lib,
    )

    b, t, heads, h = q.shape
    block = min(512, t)
    if t % block:
        raise ValueError(f"splash attention needs rows that divide into {block}-token blocks")
    one = (
        mask_lib.LocalMask((t, t), window_size=(window - 1, 0), offset=0)
        if window
        else mask_lib.CausalMask((t, t))
    )
    mask = mask_lib.MultiHeadMask([one] * heads)
    sizes = kernel_lib.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block,
        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
        block_q_dq=block, block_kv_dq=block,
    )  # fmt: skip
    kernel = kernel_lib.make_splash_mha(
        mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
    )
    q = q * jnp.asarray(h**-0.5, q.dtype)

    def one_row(qr, kr, vr, seg):
        # padding (segment 0) attends only to padding: no empty softmax rows in the kernel
        ids = kernel_lib.SegmentIds(q=seg, kv=seg)
        out = kernel(qr.swapaxes(0, 1), kr.swapaxes(0, 1), vr.swapaxes(0, 1), segment_ids=ids)
        return out.swapaxes(0, 1)

    return jax.vmap(one_row)(q, k, v, segment_ids)


def cudnn_attention(q: Array, k: Array, v: Array, segment_ids: Array, window: int = 0) -> Array:
    """cuDNN's fused attention (GPU). `jax.nn.dot_product_attention` takes no segment ids, so
    the packed-segment mask goes in as a [B, 1, T, T] boolean mask (T^2 bytes per row; the
    scores themselves stay inside the kernel)."""
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return jax.nn.dot_product_attention(
        q, k, v, mask=same[:, None], is_causal=True, implementation="cudnn",
        local_window_size=(window - 1, 0) if window else None,
    )  # fmt: skip
