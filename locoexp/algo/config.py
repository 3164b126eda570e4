"""Schema of the `algo` config group: advantage, loss, KL, optimizer, staleness correction."""

import dataclasses
import enum

from locoexp.errors import require


class AdvantageKind(enum.Enum):
    """Section I.1: GRPO normalises by the group's std; Dr. GRPO only centres."""

    grpo = "grpo"
    dr_grpo = "dr_grpo"


class LossAggregation(enum.Enum):
    """How per-token losses become one number.

    token_mean: sum over every completion token of the batch / their count (token-level GRPO).
    constant: sum / (sequences x max_new_tokens), Dr. GRPO's length-unbiased constant normaliser.
    """

    token_mean = "token_mean"
    constant = "constant"


@dataclasses.dataclass(kw_only=True)
class AlgoConfig:
    advantage: AdvantageKind = AdvantageKind.grpo
    advantage_eps: float = 1e-6  # added to the group std (GRPO only)
    loss_aggregation: LossAggregation = LossAggregation.token_mean
    clip_eps_low: float = 0.2  # ratio clipped to [1 - low, 1 + high] (PPO-style surrogate)
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0  # > 0 adds beta * k3(pi || pi_ref) per token against the initial policy
    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0  # global-norm clipping; 0 disables it
    warmup_steps: int = 0  # linear learning-rate warm-up, then constant
    # > 0: after the warm-up the rate follows a cosine from learning_rate to 0, reaching 0 at
    # this update (warm-up included): optax's / Tunix's warmup_cosine_decay_schedule (App. G).
    cosine_decay_steps: int = 0
    # Truncated importance sampling for stale rollouts (placement=da): the per-token weight
    # pi_train(old) / pi_behaviour is capped at this value. Ignored when rollouts are on-policy.
    tis_cap: float = 2.0

    def __post_init__(self):
        require(self.learning_rate > 0, f"algo.learning_rate={self.learning_rate} must be > 0.")
        require(self.advantage_eps > 0, f"algo.advantage_eps={self.advantage_eps} must be > 0.")
        require(
            0 < self.clip_eps_low < 1, f"algo.clip_eps_low={self.clip_eps_low} must be in (0, 1)."
        )
        require(self.clip_eps_high > 0, f"algo.clip_eps_high={self.clip_eps_high} must be > 0.")
        require(self.kl_coef >= 0, f"algo.kl_coef={self.kl_coef} must be >= 0.")
        require(
            self.cosine_decay_steps == 0 or self.cosine_decay_steps > self.warmup_steps,
            f"algo.cosine_decay_steps={self.cosine_decay_steps} must be 0 (constant after the "
            f"warm-up) or more than algo.warmup_steps={self.warmup_steps}.",
        )
        require(self.weight_decay >= 0, f"algo.weight_decay={self.weight_decay} must be >= 0.")
        require(
            self.max_grad_norm >= 0,
            f"algo.max_grad_norm={self.max_grad_norm} must be >= 0 (0 = off).",
        )
        require(
            0 <= self.adam_b1 < 1 and 0 <= self.adam_b2 < 1,
            "algo.adam_b1 and algo.adam_b2 must be in [0, 1).",
        )
        require(self.warmup_steps >= 0, f"algo.warmup_steps={self.warmup_steps} must be >= 0.")
        require(self.tis_cap >= 1, f"algo.tis_cap={self.tis_cap} must be >= 1.")
