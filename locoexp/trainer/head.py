"""Output head and GRPO loss in one pass over chunks of the K loss positions.

At V = 151,936 the output head is most of a small model's FLOPs (W1: 92% of rollout, 86% of the
train forward). Differentiating `logsumexp(h W^T)` with rematerialised chunks costs four head
matmuls per token (forward, recomputed forward, dh, dW). The policy loss is a sum of per-token
terms, so its derivative by each log-prob is known as soon as that log-prob is: this module
computes, per chunk, the logits once, the log-probs, the per-token loss and its derivative, and
from them dh and the chunk's share of dW — three head matmuls. The [chunk, V] logits and their
exponentials are the only large temporaries: the softmax's normalisation and the one-hot term of
dLoss/dlogits are applied on the [chunk, D] side of the gradient matmuls, so no [chunk, V]
dlogits is written (one memory pass and a scatter fewer per chunk). The result is a `custom_vjp`
whose backward only scales the stored gradients, so the rest of the model differentiates through
it as usual (a tied embedding sums both uses).

Shapes: K loss slots, D width, V vocabulary, C chunk size.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from locoexp.algo.config import LossAggregation
from locoexp.algo.grpo import per_token_loss
from locoexp.trainer.packing import TrainBatch


@dataclasses.dataclass(frozen=True)
class HeadLossSpec:
    """Static settings of the fused loss (hashable: a jit static argument)."""

    clip_eps_low: float
    clip_eps_high: float
    kl_coef: float
    tis_cap: float
    aggregation: LossAggregation
    temperature: float
    chunk: int
    # Gemma4's final logit soft cap (model.final_logit_softcap): cap * tanh(logits / cap) before
    # the temperature; 0 = none. Capped heads take `_capped_chunk_step`.
    softcap: float = 0.0


# The softmax's shift. Any per-row shift s gives the same log-probs and gradients, so long as
# total = sum_v exp(l_v - s) neither overflows nor underflows in float32. The row max (total in
# [1, V]) costs a full read of the chunk's [C, V] logits: 1.1 of the 25 s the head takes at
# Table 1's caps on CPU (experiments/LOG.md, session 8). The fast shift is the larger of the
# target's logit and the max over the first `_SHIFT_PROBE` vocabulary entries: it is one of the
# logits, so total >= 1; the whole head is recomputed with the row max when any slot's total
# exceeds `_MAX_TOTAL` (a target more than 60 nats below the best token and no probed logit
# near it), so the result is exact either way and the [C, V] arrays stay far from overflow.
_SHIFT_PROBE = 8192
_MAX_TOTAL = math.exp(60.0)


def _exact_if_needed(run):
    """run(exact) -> (outputs, overflowed): the fast shift's outputs, or the row max's where a
    chunk's total overflowed (`_MAX_TOTAL`)."""
    outputs, overflowed = run(False)
    return jax.lax.cond(overflowed, lambda: run(True)[0], lambda: outputs)


def _chunked(x: jax.Array, size: int) -> jax.Array:
    """[K, ...] -> [K/size, size, ...], padding the last chunk with copies of row 0."""
    k = x.shape[0]
    padded = -(-k // size) * size
    if padded != k:
        x = jnp.concatenate([x, jnp.broadcast_to(x[:1], (padded - k, *x.shape[1:]))])
    return x.reshape(padded // size, size, *x.shape[1:])


def _objective(spec: HeadLossSpec, denominator: jax.Array, logp: jax.Array, c: dict):
    """The chunk's share of the loss (its masked per-token terms over the batch's denominator)
    and the per-token terms for metrics."""
    per_token, terms = per_token_loss(
        logp,
        jax.lax.stop_gradient(logp),
        c["advantages"],
        clip_eps_low=spec.clip_eps_low,
        clip_eps_high=spec.clip_eps_high,
        kl_coef=spec.kl_coef,
        ref_logp=c.get("ref"),
        behaviour_logp=c["behaviour"],
        tis_cap=spec.tis_cap,
    )
    return (per_token * c["mask"]).sum() / denominator, terms


def _chunk_step(spec: HeadLossSpec, weight, denominator, dweight, h, c: dict, exact: bool):
    """One chunk of C slots (hidden states h [C, D], per-slot fields c): the chunk's loss, its
    per-term sums, dLoss/dh [C, D], `dweight` [V, D] float32 plus the chunk's dLoss/dW, and
    whether the fast shift overflowed (always False when `exact`: the row max, see
    `_SHIFT_PROBE`). Slots with mask 0 contribute nothing (their dLoss/dlogp is 0)."""
    if spec.softcap:
        return _capped_chunk_step(spec, weight, denominator, dweight, h, c)
    scale = 1.0 / spec.temperature if spec.temperature > 0 else 1.0
    targets = c["targets"]
    # the temperature scales h ([C, D]) rather than the [C, V] logits: no extra [C, V] pass
    logits = ((h * jnp.asarray(scale, h.dtype)) @ weight.T).astype(jnp.float32)  # [C, V]
    target_logit = jnp.take_along_axis(logits, targets[:, None], -1)[:, 0]
    if exact:
        shift = jnp.max(logits, axis=-1)
    else:
        shift = jnp.maximum(target_logit, jnp.max(logits[:, :_SHIFT_PROBE], axis=-1))
    unnormalised = jnp.exp(logits - shift[:, None])  # softmax * total
    total = unnormalised.sum(-1)
    overflowed = jnp.logical_not(jnp.all(total <= _MAX_TOTAL))  # inf and NaN fail too
    logp = target_logit - shift - jnp.log(total)
    objective = functools.partial(_objective, spec, denominator)
    (loss, terms), g = jax.value_and_grad(objective, has_aux=True)(logp, c)
    # dLoss/dlogits = g * scale * (onehot(target) - softmax). Both terms go to the [C, D]
    # side of the two gradient matmuls: the softmax's row scale a = -g * scale / total
    # multiplies h and the product, and the one-hot term is a gather from (dh) and a
    # scatter into (dW) C rows of [V, D]. No [C, V] dlogits is written.
    a = -g * scale / total
    hidden32 = h.astype(jnp.float32)
    weight32 = weight.astype(jnp.float32)
    onehot_rows = (g * scale)[:, None]
    dh = a[:, None] * (unnormalised @ weight32) + onehot_rows * weight32[targets]
    dweight = dweight + unnormalised.T @ (a[:, None] * hidden32)
    dweight = dweight.at[targets].add(onehot_rows * hidden32)
    sums = {key: (value * c["mask"]).sum() for key, value in terms.items()}
    return dweight, loss, sums, dh.astype(h.dtype), overflowed


def _capped_chunk_step(spec: HeadLossSpec, weight, denominator, dweight, h, c: dict):
    """`_chunk_step` for soft-capped logits l = cap * tanh(h W^T / cap) / T (Gemma4). The cap's
    derivative 1 - tanh^2 is per logit, so dLoss/dlogits is formed as one [C, V] array (the
    uncapped head keeps it on the [C, D] side); |l| <= cap / T, so the row max shift never
    overflows and the fast shift is not needed."""
    scale = 1.0 / spec.temperature if spec.temperature > 0 else 1.0
    targets = c["targets"]
    squashed = jnp.tanh((h @ weight.T).astype(jnp.float32) / spec.softcap)  # [C, V]
    logits = spec.softcap * scale * squashed
    shift = jnp.max(logits, axis=-1)
    softmax = jnp.exp(logits - shift[:, None])
    total = softmax.sum(-1)
    softmax = softmax / total[:, None]
    logp = jnp.take_along_axis(logits, targets[:, None], -1)[:, 0] - shift - jnp.log(total)
    objective = functools.partial(_objective, spec, denominator)
    (loss, terms), g = jax.value_and_grad(objective, has_aux=True)(logp, c)
    rows = jnp.arange(targets.shape[0])
    dlogits = (-g * scale)[:, None] * softmax
    dlogits = dlogits.at[rows, targets].add(g * scale)
    dlogits = dlogits * (1.0 - squashed * squashed)  # d/dx cap * tanh(x / cap)
    hidden32, weight32 = h.astype(jnp.float32), weight.astype(jnp.float32)
    dweight = dweight + dlogits.T @ hidden32
    sums = {key: (value * c["mask"]).sum() for key, value in terms.items()}
    return dweight, loss, sums, (dlogits @ weight32).astype(h.dtype), jnp.zeros((), bool)


def slot_fields(spec: HeadLossSpec, batch: TrainBatch[jax.Array]) -> dict[str, jax.Array]:
    """The per-slot inputs [K] of the loss: mask (float32), targets, advantages, the sampler's
    log-probs, and the reference's with a KL term."""
    fields = {
        "mask": batch.loss_mask.astype(jnp.float32),
        "targets": batch.loss_targets,
        "advantages": batch.advantages,
        "behaviour": batch.behaviour_logprobs,
    }
    if spec.kl_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("a loss with a KL term needs the batch's ref_logprobs (the step's)")
        fields["ref"] = batch.ref_logprobs
    return fields


def head_grads_at_slots(
    spec: HeadLossSpec,
    hidden: jax.Array,
    weight: jax.Array,
    slots: dict,
    chunks: jax.Array,
    denominator: jax.Array,
    dweight: jax.Array,
):
    """The fused head over one group of loss slots, given the hidden states [T, D] of every
    position they index (one micro-batch's rows, flat; `trainer/micro.py`).

    slots: "index" [G, S] int32 into the T positions and the per-slot fields ("mask",
    "targets", "advantages", "behaviour", and "ref" with a KL term), each [G, S]: G lanes
    (one per device) filled from the front, padded with mask 0. Chunk i is columns
    [i * C, (i + 1) * C) of every lane; only the first `chunks` (traced) are computed, so a
    group's padding costs nothing. `denominator` is the whole batch's (the loss is a sum over
    groups). Returns the group's loss, its per-term sums, dLoss/dhidden [T, D] (zero away
    from the slots) and `dweight` [V, D] float32 plus the group's dLoss/dW."""
    lanes, width = slots["index"].shape
    size = min(spec.chunk, width)
    assert width % size == 0, (width, size)  # the grouping pads lanes to whole chunks

    def chunk_of(i):
        take = lambda x: jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=1)  # noqa: E731
        return {key: take(x).reshape(lanes * size) for key, x in slots.items()}

    def run(exact: bool):
        def chunk_step(dweight, i):
            c = chunk_of(i)
            index = c.pop("index")
            step = _chunk_step(spec, weight, denominator, dweight, hidden[index], c, exact)
            return index, step

        def body(i, carry):
            dweight, loss, sums, dhidden, over = carry
            index, (dweight, chunk_loss, chunk_sums, dh, chunk_over) = chunk_step(dweight, i)
            sums = jax.tree.map(jnp.add, sums, chunk_sums)
            return dweight, loss + chunk_loss, sums, dhidden.at[index].add(dh), over | chunk_over

        sums = jax.eval_shape(chunk_step, dweight, 0)[1][2]  # the loss terms' names
        zero = lambda s: jnp.zeros(s.shape, s.dtype)  # noqa: E731
        init = (
            dweight,
            jnp.zeros((), jnp.float32),
            jax.tree.map(zero, sums),
            jnp.zeros_like(hidden),
            jnp.zeros((), bool),
        )
        *outputs, over = jax.lax.fori_loop(0, chunks, body, init)
        return tuple(outputs), over

    dweight, loss, sums, dhidden = _exact_if_needed(run)
    return loss, sums, dhidden, dweight
