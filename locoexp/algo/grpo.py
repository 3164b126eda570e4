"""GRPO math: group advantages and the token-level clipped policy-gradient loss.

Pure functions of arrays; they know nothing of models, hosts or packing. Reference: DeepSeekMath
(GRPO) and Dr. GRPO as the paper's Section I.1 uses them: "the Dr. GRPO advantage, no KL term and
one update per batch, so the importance ratio is 1".

Shapes: B prompts, G samples per prompt, K completion-token slots (flattened over the batch).
"""

import jax
import jax.numpy as jnp
import numpy as np

from locoexp.algo.config import AdvantageKind, LossAggregation


def compute_group_advantages(rewards: np.ndarray, kind: AdvantageKind, eps: float) -> np.ndarray:
    """rewards [B, G] -> advantages [B, G].

    GRPO: (r - mean_g) / (std_g + eps), std with Bessel's correction as TRL and verl compute it.
    Dr. GRPO: r - mean_g (no std normalisation, which biases towards easy/hard groups).
    A group whose rewards are all equal gets zero advantage either way.
    """
    rewards = np.asarray(rewards, np.float64)
    centred = rewards - rewards.mean(axis=-1, keepdims=True)
    match kind:
        case AdvantageKind.grpo:
            ddof = 1 if rewards.shape[-1] > 1 else 0
            advantages = centred / (rewards.std(axis=-1, ddof=ddof, keepdims=True) + eps)
        case AdvantageKind.dr_grpo:
            advantages = centred
    return advantages.astype(np.float32)


def k3_kl(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """Schulman's k3 estimator of KL(pi || pi_ref) per token: exp(d) - d - 1, d = ref - logp."""
    delta = ref_logp - logp
    return jnp.exp(delta) - delta - 1.0


def per_token_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    *,
    clip_eps_low: float,
    clip_eps_high: float,
    kl_coef: float = 0.0,
    ref_logp: jax.Array | None = None,
    behaviour_logp: jax.Array | None = None,
    tis_cap: float = 2.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token objective [K] (to be masked and aggregated) and per-token terms for metrics.

    logp: current policy log-probs (differentiated). old_logp: the policy the update starts from
    (with one update per batch it equals stop_gradient(logp), so the ratio is exactly 1).
    behaviour_logp: the sampler's log-probs; when given, each token is weighted by
    min(exp(old_logp - behaviour_logp), tis_cap) (truncated importance sampling for stale or
    mismatched samplers).
    """
    ratio = jnp.exp(logp - old_logp)
    clipped = jnp.clip(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    surrogate = jnp.minimum(ratio * advantages, clipped * advantages)
    terms = {"train/clip_share": (jnp.abs(ratio - clipped) > 0).astype(jnp.float32)}
    if behaviour_logp is not None:
        weight = jax.lax.stop_gradient(jnp.minimum(jnp.exp(old_logp - behaviour_logp), tis_cap))
        surrogate = surrogate * weight
        terms["train/tis_weight_mean"] = weight
        terms["train/sampler_logprob_gap"] = jnp.abs(old_logp - behaviour_logp)
    per_token = -surrogate
    if kl_coef > 0.0:
        if ref_logp is None:
            raise ValueError("per_token_loss: kl_coef > 0 needs the reference's ref_logp")
        kl = k3_kl(logp, jax.lax.stop_gradient(ref_logp))
        per_token = per_token + kl_coef * kl
        terms["train/kl"] = kl
    return per_token, terms


def loss_denominator(mask: jax.Array, aggregation: LossAggregation, normalizer) -> jax.Array:
    """token_mean: the batch's completion tokens; constant: sequences x max_new_tokens."""
    if aggregation is LossAggregation.token_mean:
        return jnp.maximum(mask.astype(jnp.float32).sum(), 1.0)
    return jnp.asarray(normalizer, jnp.float32)


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    aggregation: LossAggregation,
    normalizer: jax.Array | float,
    **terms_kwargs,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-level clipped surrogate over K slots; returns (loss, metrics).

    mask: 1 for real completion tokens, 0 for padding slots. normalizer: used by the constant
    aggregation (Dr. GRPO). Other keywords as `per_token_loss`.
    """
    mask = mask.astype(jnp.float32)
    per_token, terms = per_token_loss(logp, old_logp, advantages, **terms_kwargs)
    loss = (per_token * mask).sum() / loss_denominator(mask, aggregation, normalizer)
    count = jnp.maximum(mask.sum(), 1.0)
    return loss, {key: (value * mask).sum() / count for key, value in terms.items()}
