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

import jax
import jax.numpy as jnp

from locoexp.algo.config import LossAggregation
from locoexp.algo.grpo import loss_denominator, per_token_loss
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


def _chunked(x: jax.Array, size: int) -> jax.Array:
    """[K, ...] -> [K/size, size, ...], padding the last chunk with copies of row 0."""
    k = x.shape[0]
    padded = -(-k // size) * size
    if padded != k:
        x = jnp.concatenate([x, jnp.broadcast_to(x[:1], (padded - k, *x.shape[1:]))])
    return x.reshape(padded // size, size, *x.shape[1:])


def head_loss_and_grads(
    spec: HeadLossSpec, hidden: jax.Array, weight: jax.Array, batch: TrainBatch
):
    """Loss, per-term sums, dLoss/dhidden [K, D] and dLoss/dweight [V, D]."""
    k = hidden.shape[0]
    size = min(spec.chunk, k)
    scale = 1.0 / spec.temperature if spec.temperature > 0 else 1.0
    mask = batch.loss_mask.astype(jnp.float32)
    denominator = loss_denominator(mask, spec.aggregation, batch.normalizer)
    per_slot = {  # the scan's per-chunk inputs
        "mask": mask,
        "targets": batch.loss_targets,
        "advantages": batch.advantages,
        "behaviour": batch.behaviour_logprobs,
    }
    if spec.kl_coef > 0:
        per_slot["ref"] = batch.ref_logprobs
    per_slot["mask"] = jnp.concatenate([mask, jnp.zeros((-k) % size, jnp.float32)])  # pads count 0
    chunks = jax.tree.map(lambda x: _chunked(x, size), {"hidden": hidden, **per_slot})

    def objective(logp, c):
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

    def step(dweight, c):
        h = c["hidden"]
        targets = c["targets"]
        # the temperature scales h ([C, D]) rather than the [C, V] logits: no extra [C, V] pass
        logits = ((h * jnp.asarray(scale, h.dtype)) @ weight.T).astype(jnp.float32)  # [C, V]
        top = jnp.max(logits, axis=-1)
        unnormalised = jnp.exp(logits - top[:, None])  # softmax * total
        total = unnormalised.sum(-1)
        logp = jnp.take_along_axis(logits, targets[:, None], -1)[:, 0] - top - jnp.log(total)
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
        return dweight, (loss, sums, dh.astype(h.dtype))

    dweight, (losses, sums, dh) = jax.lax.scan(step, jnp.zeros(weight.shape, jnp.float32), chunks)
    count = jnp.maximum(mask.sum(), 1.0)
    metrics = {key: value.sum() / count for key, value in sums.items()}
    return losses.sum(), metrics, dh.reshape(-1, hidden.shape[1])[:k], dweight.astype(weight.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def head_loss(spec: HeadLossSpec, hidden: jax.Array, weight: jax.Array, batch: TrainBatch):
    """(loss, metrics) of the policy given final hidden states at the K loss positions and the
    output-head weight [V, D] (the tied embedding or the transposed lm_head kernel)."""
    loss, metrics, _, _ = head_loss_and_grads(spec, hidden, weight, batch)
    return loss, metrics


def _head_loss_fwd(spec, hidden, weight, batch):
    loss, metrics, dh, dweight = head_loss_and_grads(spec, hidden, weight, batch)
    return (loss, metrics), (dh, dweight)


def _head_loss_bwd(spec, residuals, cotangents):
    dh, dweight = residuals
    scale = cotangents[0]  # metrics are auxiliary outputs: their cotangents are not used
    # cotangents keep their primals' dtypes (bfloat16 params: a float32 scale must not promote)
    return (scale * dh).astype(dh.dtype), (scale * dweight).astype(dweight.dtype), None


head_loss.defvjp(_head_loss_fwd, _head_loss_bwd)
