"""GRPO math against a loop-based NumPy reference and hand-computed cases.

The references below are written one group, one token at a time, straight from the equations
(DeepSeekMath's GRPO, Dr. GRPO, Schulman's k3), so they share no vectorised code with
`locoexp.algo.grpo`.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locoexp.algo.config import AdvantageKind, LossAggregation
from locoexp.algo.grpo import compute_group_advantages, k3_kl, per_token_loss, policy_loss

EPS = 1e-6
CLIP_LOW, CLIP_HIGH = 0.2, 0.28


def reference_advantages(rewards: np.ndarray, kind: AdvantageKind, eps: float) -> np.ndarray:
    out = np.zeros(rewards.shape)
    for b, group in enumerate(rewards):
        g = len(group)
        mean = sum(float(r) for r in group) / g
        std = math.sqrt(sum((float(r) - mean) ** 2 for r in group) / (g - 1)) if g > 1 else 0.0
        for i, r in enumerate(group):
            centred = float(r) - mean
            out[b, i] = centred / (std + eps) if kind is AdvantageKind.grpo else centred
    return out


def reference_loss(
    logp,
    old,
    adv,
    mask,
    *,
    aggregation,
    normalizer,
    kl_coef=0.0,
    ref=None,
    behaviour=None,
    tis_cap=2.0,
) -> float:
    total, count = 0.0, 0.0
    for k in range(len(logp)):
        ratio = math.exp(logp[k] - old[k])
        clipped = min(max(ratio, 1 - CLIP_LOW), 1 + CLIP_HIGH)
        surrogate = min(ratio * adv[k], clipped * adv[k])
        if behaviour is not None:
            surrogate *= min(math.exp(old[k] - behaviour[k]), tis_cap)
        per_token = -surrogate
        if kl_coef > 0:
            d = ref[k] - logp[k]
            per_token += kl_coef * (math.exp(d) - d - 1)
        total += per_token * mask[k]
        count += mask[k]
    denominator = max(count, 1.0) if aggregation is LossAggregation.token_mean else normalizer
    return total / denominator


def loss(logp, old, adv, mask, *, aggregation=LossAggregation.token_mean, normalizer=1.0, **kw):
    value, _ = policy_loss(
        jnp.asarray(logp, jnp.float32),
        jnp.asarray(old, jnp.float32),
        jnp.asarray(adv, jnp.float32),
        jnp.asarray(mask, jnp.float32),
        clip_eps_low=CLIP_LOW,
        clip_eps_high=CLIP_HIGH,
        aggregation=aggregation,
        normalizer=normalizer,
        **{
            k: jnp.asarray(v, jnp.float32) if isinstance(v, np.ndarray) else v
            for k, v in kw.items()
        },
    )
    return float(value)


def random_slots(seed: int, k: int = 64):
    rng = np.random.default_rng(seed)
    logp = rng.uniform(-4.0, -0.1, k)
    return {
        "logp": logp,
        "old": logp + rng.normal(0, 0.3, k),  # ratios on both sides of the clip range
        "adv": rng.normal(0, 1, k),
        "mask": (rng.uniform(size=k) < 0.8).astype(np.float64),
        "ref": logp + rng.normal(0, 0.5, k),
        "behaviour": logp + rng.normal(0, 0.8, k),  # some TIS weights above the cap
    }


@pytest.mark.parametrize("kind", list(AdvantageKind))
@pytest.mark.parametrize("group", [2, 5, 8])
def test_advantages_equal_loop_reference(kind, group):
    rewards = np.random.default_rng(group).uniform(0, 1, (6, group)).round(2)
    rewards[0] = 0.5  # one group of equal rewards
    np.testing.assert_allclose(
        compute_group_advantages(rewards, kind, EPS),
        reference_advantages(rewards, kind, EPS),
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.parametrize("kind", list(AdvantageKind))
def test_equal_rewards_give_zero_advantage(kind):
    rewards = np.array([[0.0] * 4, [1.0] * 4, [0.37] * 4, [0.25] * 4])
    np.testing.assert_array_equal(compute_group_advantages(rewards, kind, EPS), 0.0)
    np.testing.assert_array_equal(compute_group_advantages(np.array([[0.7]]), kind, EPS), 0.0)


def test_advantages_hand_computed():
    rewards = np.array([[1.0, 0.0, 0.0, 0.0]])
    # mean 0.25; Bessel std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    np.testing.assert_allclose(
        compute_group_advantages(rewards, AdvantageKind.grpo, EPS),
        [[0.75 / (0.5 + EPS), -0.25 / (0.5 + EPS), -0.25 / (0.5 + EPS), -0.25 / (0.5 + EPS)]],
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        compute_group_advantages(rewards, AdvantageKind.dr_grpo, EPS),
        [[0.75, -0.25, -0.25, -0.25]],
        rtol=1e-6,
    )


@pytest.mark.parametrize("aggregation", list(LossAggregation))
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
@pytest.mark.parametrize("with_behaviour", [False, True])
def test_loss_equals_loop_reference(aggregation, kl_coef, with_behaviour):
    s = random_slots(seed=int(kl_coef * 10) + 2 * with_behaviour)
    extra = {"kl_coef": kl_coef, "ref_logp": s["ref"] if kl_coef else None}
    if with_behaviour:
        extra.update(behaviour_logp=s["behaviour"], tis_cap=2.0)
    expected = reference_loss(
        s["logp"],
        s["old"],
        s["adv"],
        s["mask"],
        aggregation=aggregation,
        normalizer=96.0,
        kl_coef=kl_coef,
        ref=s["ref"],
        behaviour=s["behaviour"] if with_behaviour else None,
        tis_cap=2.0,
    )
    got = loss(
        s["logp"], s["old"], s["adv"], s["mask"], aggregation=aggregation, normalizer=96.0, **extra
    )
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_tis_weight_is_capped():
    """A behaviour log-prob far below the trainer's gives weight exp(gap), capped at tis_cap."""
    logp = np.array([-1.0, -1.0])
    behaviour = np.array([-1.0 - math.log(1.5), -6.0])  # weights 1.5 and e^5 -> 2
    adv, mask = np.array([1.0, 1.0]), np.ones(2)
    got = loss(logp, logp, adv, mask, behaviour_logp=behaviour, tis_cap=2.0)
    assert got == pytest.approx(-(1.5 + 2.0) / 2, rel=1e-5)


def test_padding_slots_do_not_change_loss_or_gradient():
    s = random_slots(seed=5, k=32)
    real = {k: v for k, v in s.items()}
    real["mask"] = np.ones(32)
    rng = np.random.default_rng(9)
    padded = {k: np.concatenate([v, rng.uniform(-20, 0, 16)]) for k, v in real.items()}
    padded["adv"][32:] = rng.normal(0, 100, 16)
    padded["mask"][32:] = 0.0
    for aggregation in LossAggregation:
        values, grads = [], []
        for slots in (real, padded):

            def f(logp, slots=slots, aggregation=aggregation):
                value, _ = policy_loss(
                    logp,
                    jnp.asarray(slots["old"], jnp.float32),
                    jnp.asarray(slots["adv"], jnp.float32),
                    jnp.asarray(slots["mask"], jnp.float32),
                    clip_eps_low=CLIP_LOW,
                    clip_eps_high=CLIP_HIGH,
                    aggregation=aggregation,
                    normalizer=40.0,
                    kl_coef=0.1,
                    ref_logp=jnp.asarray(slots["ref"], jnp.float32),
                    behaviour_logp=jnp.asarray(slots["behaviour"], jnp.float32),
                )
                return value

            value, grad = jax.value_and_grad(f)(jnp.asarray(slots["logp"], jnp.float32))
            values.append(float(value))
            grads.append(np.asarray(grad))
        assert values[1] == pytest.approx(values[0], rel=1e-6), aggregation
        np.testing.assert_allclose(grads[1][:32], grads[0], rtol=1e-6, atol=1e-9)
        np.testing.assert_array_equal(grads[1][32:], 0.0)


@pytest.mark.parametrize(
    "aggregation, denominator",
    [(LossAggregation.token_mean, 5.0), (LossAggregation.constant, 12.0)],
)
def test_on_policy_ratio_is_one_and_gradient_is_minus_advantage_over_count(
    aggregation, denominator
):
    logp = jnp.array([-0.5, -1.2, -2.0, -0.1, -3.0, -0.7, -1.0, -1.5])
    adv = jnp.array([1.0, -0.5, 2.0, 0.3, -1.5, 0.0, 4.0, -2.0])
    mask = jnp.array([1, 1, 1, 0, 1, 1, 0, 0], jnp.float32)  # 5 real tokens

    def f(lp):
        value, metrics = policy_loss(
            lp,
            jax.lax.stop_gradient(lp),
            adv,
            mask,
            clip_eps_low=CLIP_LOW,
            clip_eps_high=CLIP_HIGH,
            aggregation=aggregation,
            normalizer=denominator,
        )
        return value, metrics

    (value, metrics), grad = jax.value_and_grad(f, has_aux=True)(logp)
    assert float(metrics["train/clip_share"]) == 0.0  # ratio exactly 1: nothing clipped
    assert float(value) == pytest.approx(-float((adv * mask).sum()) / denominator, rel=1e-6)
    np.testing.assert_allclose(np.asarray(grad), -np.asarray(adv * mask) / denominator, rtol=1e-6)


def test_clipped_tokens_get_no_gradient():
    # A > 0 with ratio above 1 + high, A < 0 with ratio below 1 - low: both clipped
    logp = jnp.log(jnp.array([1.5, 0.5, 1.1]))
    old = jnp.zeros(3)
    adv = jnp.array([1.0, -1.0, 1.0])

    def f(lp):
        return policy_loss(
            lp,
            old,
            adv,
            jnp.ones(3),
            clip_eps_low=CLIP_LOW,
            clip_eps_high=CLIP_HIGH,
            aggregation=LossAggregation.token_mean,
            normalizer=1.0,
        )[0]

    grad = np.asarray(jax.grad(f)(logp))
    assert grad[0] == 0.0 and grad[1] == 0.0
    assert grad[2] == pytest.approx(-1.1 / 3, rel=1e-5)  # d(-ratio * A)/d logp = -ratio * A


def test_k3_is_zero_at_the_reference_and_positive_elsewhere():
    logp = jnp.array([-1.0, -1.0, -1.0])
    ref = jnp.array([-1.0, -0.5, -3.0])
    kl = np.asarray(k3_kl(logp, ref))
    assert kl[0] == 0.0
    for d, value in zip([0.5, -2.0], kl[1:], strict=True):
        assert value == pytest.approx(math.exp(d) - d - 1, rel=1e-6) and value > 0


def test_a_kl_term_without_the_reference_log_probs_is_refused():
    logp = jnp.zeros(3)
    with pytest.raises(ValueError, match="kl_coef > 0 needs the reference's ref_logp"):
        per_token_loss(logp, logp, logp, clip_eps_low=0.2, clip_eps_high=0.2, kl_coef=0.1)
