"""The fused output head + GRPO loss (the trainer's `head_grads_at_slots`) equals autodiff of the
plain formulation."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from locoexp.algo.config import LossAggregation
from locoexp.algo.grpo import loss_denominator, policy_loss
from locoexp.model.config import ModelConfig
from locoexp.model.transformer import build_model
from locoexp.trainer.head import (
    _SHIFT_PROBE,
    HeadLossSpec,
    _chunk_step,
    head_grads_at_slots,
    slot_fields,
)
from locoexp.trainer.packing import pack_sequences, train_view
from locoexp.trainer.trainer import head_weight, loss_position_hidden, token_logprobs


def _head_at_slots(spec: HeadLossSpec, hidden, weight, batch):
    """The trainer's head (`head_grads_at_slots`) over K slots that index K hidden states in
    order, one lane padded to whole chunks: loss, per-term means, dLoss/dhidden, dLoss/dW."""
    k = hidden.shape[0]
    width = -(-k // spec.chunk) * spec.chunk
    fields = slot_fields(spec, batch)
    slots = {key: jnp.pad(x, (0, width - k))[None] for key, x in fields.items()}  # mask 0
    slots["index"] = jnp.minimum(jnp.arange(width), k - 1)[None]
    denominator = loss_denominator(fields["mask"], spec.aggregation, batch.normalizer)
    dweight = jnp.zeros(weight.shape, jnp.float32)
    loss, sums, dh, dw = head_grads_at_slots(
        spec, hidden, weight, slots, width // spec.chunk, denominator, dweight
    )
    count = jnp.maximum(fields["mask"].sum(), 1.0)
    return loss, {key: value / count for key, value in sums.items()}, dh, dw.astype(weight.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def head_loss(spec: HeadLossSpec, hidden, weight, batch):
    """(loss, metrics) with the trainer head's own gradients as its VJP (metrics auxiliary)."""
    return _head_at_slots(spec, hidden, weight, batch)[:2]


def _head_loss_fwd(spec, hidden, weight, batch):
    loss, metrics, dh, dweight = _head_at_slots(spec, hidden, weight, batch)
    return (loss, metrics), (dh, dweight)


def _head_loss_bwd(spec, residuals, cotangents):
    dh, dweight = residuals
    scale = cotangents[0]
    return (scale * dh).astype(dh.dtype), (scale * dweight).astype(dweight.dtype), None


head_loss.defvjp(_head_loss_fwd, _head_loss_bwd)


def _batch(k_pad: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, 32, size=rng.integers(2, 6)).astype(np.int32) for _ in range(6)]
    completions = [rng.integers(3, 32, size=rng.integers(1, 5)).astype(np.int32) for _ in range(6)]
    behaviour = [rng.normal(-3.4, 0.3, size=len(c)).astype(np.float32) for c in completions]
    packed = pack_sequences(
        prompts,
        completions,
        behaviour,
        rng.normal(size=6).astype(np.float32),
        row_tokens=16,
        loss_slots=k_pad,
    )
    view = train_view(packed, normalizer=6 * 4)
    ref = rng.normal(-3.5, 0.2, size=k_pad).astype(np.float32)
    return jax.tree.map(jnp.asarray, dataclasses.replace(view, ref_logprobs=ref))


def _spec(**changes) -> HeadLossSpec:
    """The fused loss's settings in these tests (chunks of 8: K = 28 pads the last one)."""
    spec = HeadLossSpec(
        clip_eps_low=0.2,
        clip_eps_high=0.28,
        kl_coef=0.0,
        tis_cap=2.0,
        aggregation=LossAggregation.token_mean,
        temperature=0.7,
        chunk=8,
    )
    return dataclasses.replace(spec, **changes)


@pytest.mark.parametrize(
    ("tied", "aggregation", "kl_coef", "softcap"),
    [
        (True, LossAggregation.token_mean, 0.0, 0.0),
        (False, LossAggregation.constant, 0.1, 0.0),
        (True, LossAggregation.constant, 0.1, 0.0),
        (True, LossAggregation.token_mean, 0.1, 0.5),  # Gemma4's soft-capped logits
    ],
)
def test_fused_head_loss_and_gradients_equal_autodiff(tied, aggregation, kl_coef, softcap):
    config = ModelConfig(
        vocab_size=32,
        hidden_dim=16,
        mlp_dim=32,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        tie_embeddings=tied,
        final_logit_softcap=softcap,  # model.logits caps, so `plain` below does too
        init_std=0.5 if softcap else 0.02,  # logits large enough for the cap to bend them
    )
    graphdef, params = nnx.split(build_model(config, seed=0), nnx.Param)
    batch = _batch(k_pad=28)  # not a multiple of the chunk: the last chunk is padded
    spec = _spec(kl_coef=kl_coef, aggregation=aggregation, softcap=softcap)

    def fused(p):
        model = nnx.merge(graphdef, p)
        return head_loss(spec, loss_position_hidden(model, batch), head_weight(model), batch)

    def plain(p):
        logp = token_logprobs(nnx.merge(graphdef, p), batch, temperature=0.7, chunk=8)
        return policy_loss(
            logp,
            jax.lax.stop_gradient(logp),
            batch.advantages,
            batch.loss_mask,
            aggregation=aggregation,
            normalizer=batch.normalizer,
            clip_eps_low=0.2,
            clip_eps_high=0.28,
            kl_coef=kl_coef,
            ref_logp=batch.ref_logprobs,
            behaviour_logp=batch.behaviour_logprobs,
            tis_cap=2.0,
        )

    (loss_f, metrics_f), grads_f = jax.value_and_grad(fused, has_aux=True)(params)
    (loss_p, metrics_p), grads_p = jax.value_and_grad(plain, has_aux=True)(params)
    np.testing.assert_allclose(loss_f, loss_p, rtol=1e-5, atol=1e-6)
    for key in metrics_p:
        np.testing.assert_allclose(
            metrics_f[key], metrics_p[key], rtol=1e-5, atol=1e-6, err_msg=key
        )
    flat_f, flat_p = jax.tree.leaves(grads_f), jax.tree.leaves(grads_p)
    for a, b in zip(flat_f, flat_p, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_bfloat16_parameters_train_with_bfloat16_gradients():
    import jax.numpy as jnp  # noqa: F811

    from locoexp.model.config import DType

    config = ModelConfig(
        vocab_size=32,
        hidden_dim=16,
        mlp_dim=32,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        param_dtype=DType.bfloat16,
    )
    graphdef, params = nnx.split(build_model(config, seed=0), nnx.Param)
    batch = _batch(k_pad=28)
    spec = _spec(clip_eps_high=0.2, temperature=1.0)

    def fused(p):
        model = nnx.merge(graphdef, p)
        return head_loss(spec, loss_position_hidden(model, batch), head_weight(model), batch)[0]

    grads = jax.grad(fused)(params)
    assert all(g.dtype == jnp.bfloat16 for g in jax.tree.leaves(grads))
    assert all(bool(jnp.isfinite(g.astype(jnp.float32)).all()) for g in jax.tree.leaves(grads))


@pytest.mark.parametrize(("best_logit", "falls_back"), [(30.0, False), (100.0, True)])
def test_the_fast_softmax_shift_gives_the_exact_head_and_falls_back_when_it_overflows(
    best_logit, falls_back
):
    """A vocabulary wider than the probe (`_SHIFT_PROBE`), whose best token lies beyond it: the
    fast shift (target or probed logit) sits `best_logit` / 0.7 below the row max. Within 60 nats
    the fast path is kept, beyond it the head reruns with the row max; both equal autodiff of
    the plain log-softmax."""
    vocab, width = _SHIFT_PROBE + 808, 8
    batch = _batch(k_pad=28)
    rng = np.random.default_rng(1)
    hidden = rng.normal(size=(28, width)).astype(np.float32)
    hidden[:, 0] = 1.0 + 0.05 * rng.normal(size=28)
    weight = (0.1 * rng.normal(size=(vocab, width))).astype(np.float32)
    weight[-1] = 0.0
    weight[-1, 0] = best_logit  # logit ~best_logit for every slot, outside the probe
    hidden, weight = jnp.asarray(hidden), jnp.asarray(weight)
    spec = _spec()
    fields = {k: v[:8] for k, v in slot_fields(spec, batch).items()}
    step = _chunk_step(spec, weight, 1.0, jnp.zeros(weight.shape), hidden[:8], fields, False)
    assert bool(step[-1]) is falls_back  # the path under test is the one taken

    def plain(hidden, weight):
        logits = (hidden / 0.7) @ weight.T
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), batch.loss_targets[:, None], -1)[
            :, 0
        ]
        return policy_loss(
            logp,
            jax.lax.stop_gradient(logp),
            batch.advantages,
            batch.loss_mask,
            aggregation=LossAggregation.token_mean,
            normalizer=batch.normalizer,
            clip_eps_low=0.2,
            clip_eps_high=0.28,
            kl_coef=0.0,
            ref_logp=batch.ref_logprobs,
            behaviour_logp=batch.behaviour_logprobs,
            tis_cap=2.0,
        )[0]

    fused = lambda hidden, weight: head_loss(spec, hidden, weight, batch)[0]  # noqa: E731
    loss_f, grads_f = jax.value_and_grad(fused, argnums=(0, 1))(hidden, weight)
    loss_p, grads_p = jax.value_and_grad(plain, argnums=(0, 1))(hidden, weight)
    np.testing.assert_allclose(loss_f, loss_p, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_f, grads_p, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_a_kl_loss_without_the_batch_s_reference_log_probs_is_refused():
    spec = HeadLossSpec(
        clip_eps_low=0.2, clip_eps_high=0.2, kl_coef=0.1, tis_cap=2.0,
        aggregation=LossAggregation.token_mean, temperature=1.0, chunk=4,
    )  # fmt: skip
    packed = pack_sequences(
        [np.array([1, 2]), np.array([3])], [np.array([4, 5]), np.array([6])],
        [np.zeros(2, np.float32), np.zeros(1, np.float32)], np.array([1.0, -1.0]), row_tokens=8,
    )  # fmt: skip
    with pytest.raises(ValueError, match="needs the batch's ref_logprobs"):
        slot_fields(spec, train_view(packed, normalizer=1.0))  # ref_logprobs: None
