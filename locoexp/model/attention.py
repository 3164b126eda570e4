"""Causal self-attention over packed training rows, one kernel per `AttentionKind`.

The train step attends within each packed sequence (same segment id, not in the future), never
across sequences or from padding (segment 0). `attend` dispatches on the kind; every kernel takes
q [B, T, K*R, h], k and v [B, T, K, h] and the segment ids [B, T] and returns [B, T, K*R, h].
Only `dense` forms [B, K, R, T, T] scores; `blockwise` keeps [B, K, R, Q, C] per block pair
(forward and backward), so its memory grows linearly with T.

It owns the attention numerics of full rows only: it never sees a KV cache (the engine path in
`transformer.py`), a mesh or a loss. Padding queries (segment 0) attend to nothing: `dense` gives
them uniform weights, the other kernels zeros; neither reaches a loss.

Shapes: B rows, T tokens, K KV heads, R query heads per KV head, h head_dim, Q = C block tokens,
n blocks per row.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from locoexp.model.config import AttentionKind

Array = jax.Array

_MASKED = -1e30  # finite so that fully masked (padding) rows give uniform, not NaN, weights
_einsum32 = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """The trainer's choice of kernel (`trainer.attention`, `trainer.attention_block_tokens`)."""

    kind: AttentionKind = AttentionKind.dense
    block_tokens: int = 512


def causal_segment_mask(segment_ids: Array) -> Array:
    """[B,T] segment ids (0 = padding) -> [B,T,T] mask: same segment and not in the future."""
    t = segment_ids.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return same & causal & (segment_ids[:, :, None] > 0)


def attend(spec: AttentionSpec, q: Array, k: Array, v: Array, segment_ids: Array) -> Array:
    """Causal, segment-masked attention of packed rows with the kernel `spec.kind`."""
    match spec.kind:
        case AttentionKind.dense:
            return dense_attention(q, k, v, segment_ids)
        case AttentionKind.blockwise:
            return blockwise_attention(q, k, v, segment_ids, spec.block_tokens)
        case AttentionKind.splash:
            return splash_attention(q, k, v, segment_ids, interpret=False)
        case AttentionKind.cudnn:
            return cudnn_attention(q, k, v, segment_ids)


def _grouped(q: Array, kv_heads: int) -> Array:
    """q [B, T, K*R, h] -> [B, T, K, R, h] (query head j reads KV head j // R)."""
    b, t, heads, h = q.shape
    return q.reshape(b, t, kv_heads, heads // kv_heads, h)


def dense_attention(q: Array, k: Array, v: Array, segment_ids: Array) -> Array:
    """The reference: [B, K, R, T, T] scores under the [B, T, T] causal segment mask."""
    b, t, heads, h = q.shape
    mask = causal_segment_mask(segment_ids)
    scores = jnp.einsum(
        "btkrh,bskh->bkrts", _grouped(q, k.shape[2]), k, preferred_element_type=jnp.float32
    )
    scores = jnp.where(mask[:, None, None], scores * (h**-0.5), _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkrts,bskh->btkrh", probs, v).reshape(b, t, heads, h)


# ---- blockwise: online softmax (flash attention) in plain JAX -------------------------------


def _split_blocks(x: Array, size: int) -> Array:
    """[B, T, ...] -> [n, B, size, ...], padding T to a multiple of `size` with zeros (padding
    segment ids are 0, so padded keys are never attended)."""
    b, t = x.shape[:2]
    n = -(-t // size)
    x = jnp.pad(x, [(0, 0), (0, n * size - t)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(b, n, size, *x.shape[2:]), 1, 0)


def _join_blocks(x: Array, t: int) -> Array:
    """[n, B, size, ...] -> [B, T, ...] (inverse of `_split_blocks`)."""
    n, b, size = x.shape[:3]
    return jnp.moveaxis(x, 0, 1).reshape(b, n * size, *x.shape[3:])[:, :t]


def _allowed(seg_q: Array, seg_k: Array, i, j, size: int) -> Array:
    """[B, Q] x [B, C] segment ids of query block i and key block j -> [B, Q, C] mask."""
    offsets = jnp.arange(size)
    causal = (i * size + offsets)[:, None] >= (j * size + offsets)[None, :]
    same = seg_q[:, :, None] == seg_k[:, None, :]
    return same & causal & (seg_q[:, :, None] > 0)


def _block_scores(qi: Array, kj: Array, allowed: Array) -> Array:
    """[B, Q, K, R, h] x [B, C, K, h] -> scaled scores [B, K, R, Q, C], -inf where not allowed."""
    scores = _einsum32("bqkrh,bckh->bkrqc", qi, kj)
    return jnp.where(allowed[:, None, None], scores * (qi.shape[-1] ** -0.5), -jnp.inf)


def _flash_forward(q, k, v, seg, size):
    """Blocks in ([n, B, Q, K, R, h], [n, B, C, K, h] x2, [n, B, Q]) -> out blocks
    [n, B, Q, K, R, h] and log-sum-exps [n, B, K, R, Q] (0 for rows that attend to nothing)."""
    n = q.shape[0]

    def query_block(i):
        qi, seg_i = q[i], seg[i]
        b, size_q, kv, r, h = qi.shape

        def key_block(j, carry):
            top, total, acc = carry  # [B, K, R, Q] x2, [B, Q, K, R, h]
            scores = _block_scores(qi, k[j], _allowed(seg_i, seg[j], i, j, size))
            new_top = jnp.maximum(top, scores.max(-1))
            probs = jnp.exp(scores - new_top[..., None])
            decay = jnp.exp(top - new_top)
            pv = _einsum32("bkrqc,bckh->bqkrh", probs.astype(v.dtype), v[j])
            acc = acc * jnp.moveaxis(decay, -1, 1)[..., None] + pv
            return new_top, decay * total + probs.sum(-1), acc

        init = (
            jnp.full((b, kv, r, size_q), _MASKED, jnp.float32),
            jnp.zeros((b, kv, r, size_q), jnp.float32),
            jnp.zeros(qi.shape, jnp.float32),
        )
        top, total, acc = jax.lax.fori_loop(0, i + 1, key_block, init)  # causal: keys <= i
        seen = total > 0
        lse = jnp.where(seen, top + jnp.log(jnp.where(seen, total, 1.0)), 0.0)
        inverse = jnp.where(seen, 1.0 / jnp.where(seen, total, 1.0), 0.0)
        return (acc * jnp.moveaxis(inverse, -1, 1)[..., None]).astype(q.dtype), lse

    return jax.lax.map(query_block, jnp.arange(n))


def _flash_backward(q, k, v, seg, out, lse, dout, size):
    """dq, dk, dv blocks from the forward's out and log-sum-exps, recomputing each block's
    probabilities (FlashAttention-2's backward): no [T, T] array is formed."""
    n = q.shape[0]
    # D_i = rowsum(dO_i * O_i) [n, B, K, R, Q]
    delta = jnp.moveaxis((dout.astype(jnp.float32) * out.astype(jnp.float32)).sum(-1), 2, -1)

    def key_block(dq, j):
        kj, vj = k[j], v[j]

        def query_block(i, carry):
            dk, dv, dq = carry
            qi, doi = q[i], dout[i]
            scores = _block_scores(qi, kj, _allowed(seg[i], seg[j], i, j, size))
            probs = jnp.exp(scores - lse[i][..., None])  # exactly 0 where not allowed
            dv = dv + _einsum32("bkrqc,bqkrh->bckh", probs, doi)
            dprobs = _einsum32("bqkrh,bckh->bkrqc", doi, vj)
            dscores = probs * (dprobs - delta[i][..., None]) * (qi.shape[-1] ** -0.5)
            dq_i = _einsum32("bkrqc,bckh->bqkrh", dscores, kj)
            dq = jax.lax.dynamic_update_index_in_dim(dq, dq[i] + dq_i, i, 0)
            dk = dk + _einsum32("bkrqc,bqkrh->bckh", dscores, qi)
            return dk, dv, dq

        zeros = jnp.zeros(kj.shape, jnp.float32)
        dk, dv, dq = jax.lax.fori_loop(j, n, query_block, (zeros, zeros, dq))  # causal: i >= j
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(key_block, jnp.zeros(q.shape, jnp.float32), jnp.arange(n))
    return dq, dk, dv


def _blocked_inputs(q, k, v, segment_ids, block_tokens):
    size = min(block_tokens, -(-q.shape[1] // 8) * 8)
    grouped = _grouped(q, k.shape[2])
    blocks = [_split_blocks(x, size) for x in (grouped, k, v, segment_ids)]
    return blocks, size


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def blockwise_attention(q: Array, k: Array, v: Array, segment_ids: Array, block_tokens: int):
    """Flash-attention-style attention in blocks of `block_tokens` (both directions)."""
    out, _ = _blockwise_fwd(q, k, v, segment_ids, block_tokens)
    return out


def _blockwise_fwd(q, k, v, segment_ids, block_tokens):
    (qb, kb, vb, sb), size = _blocked_inputs(q, k, v, segment_ids, block_tokens)
    out, lse = _flash_forward(qb, kb, vb, sb, size)
    result = _join_blocks(out, q.shape[1]).reshape(q.shape)
    return result, (q, k, v, segment_ids, out, lse)


def _blockwise_bwd(block_tokens, residuals, dout):
    q, k, v, segment_ids, out, lse = residuals
    (qb, kb, vb, sb), size = _blocked_inputs(q, k, v, segment_ids, block_tokens)
    dout_b = _split_blocks(_grouped(dout, k.shape[2]), size)
    dq, dk, dv = _flash_backward(qb, kb, vb, sb, out, lse, dout_b, size)
    t = q.shape[1]
    return (
        _join_blocks(dq, t).reshape(q.shape).astype(q.dtype),
        _join_blocks(dk, t).astype(k.dtype),
        _join_blocks(dv, t).astype(v.dtype),
        None,
    )


blockwise_attention.defvjp(_blockwise_fwd, _blockwise_bwd)


# ---- backend kernels -------------------------------------------------------------------------


def splash_attention(q: Array, k: Array, v: Array, segment_ids: Array, *, interpret: bool):
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
    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((t, t))] * heads)
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


def cudnn_attention(q: Array, k: Array, v: Array, segment_ids: Array) -> Array:
    """cuDNN's fused attention (GPU). `jax.nn.dot_product_attention` takes no segment ids, so
    the packed-segment mask goes in as a [B, 1, T, T] boolean mask (T^2 bytes per row; the
    scores themselves stay inside the kernel)."""
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return jax.nn.dot_product_attention(
        q, k, v, mask=same[:, None], is_causal=True, implementation="cudnn"
    )
