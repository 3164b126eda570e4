"""Plain values the step and the loop run with: `StepSettings` (one step, every half),
`LoopPlan` (the loop: steps, staleness, evaluation, levers, cost-to-learn) and `HalvesSpec`
(what builds the two halves).

Both are frozen and jax-free, so a `locoexp.session.RunSpec` that holds them can be built,
compared and shipped to Ray actors without a JAX backend. This module decides nothing: the
builder (`locoexp.session.spec.build_spec`) fills them from the config.
"""

import dataclasses

from locoexp.adapter.config import AdapterConfig
from locoexp.algo.config import AdvantageKind, AlgoConfig
from locoexp.dataset.config import DatasetConfig
from locoexp.metrics.steady import SteadyWindow, steady_window
from locoexp.model.config import DType, ModelConfig
from locoexp.placement.config import OptConfig
from locoexp.rollout.config import RolloutConfig, SamplingParams
from locoexp.rollout.straggler import StragglerConfig
from locoexp.trainer.config import TrainerConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepSettings:
    """Plain values one step needs (from the config groups)."""

    group_size: int
    max_new_tokens: int
    row_tokens: int
    loss_slot_multiple: int  # K per host is a multiple of this (head chunk x local devices)
    sampling: SamplingParams
    eval_sampling: SamplingParams
    advantage: AdvantageKind
    advantage_eps: float
    opt: OptConfig
    seed: int = 0
    straggler: StragglerConfig = dataclasses.field(default_factory=StragglerConfig)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopPlan:
    steps: int
    staleness: int  # 0: co, single_controller; 1: da
    eval_every_steps: int
    eval_at_updates: tuple[int, ...]
    eval_limit: int | None
    metrics_off_barrier: bool  # O1
    freeze_gc: bool  # O2
    # cost-to-learn (Appendix I.1): the target accuracy and what a chip-hour is
    eval_target: float
    chips: int
    chip_hour_price_usd: float
    start_step: int = 0  # a resumed run's first step (the restored checkpoint's next step)
    # the prompt order's passes, which place Appendix A's steady window (`metrics.steady`)
    batches_per_pass: int | None = None
    passes: int = 1

    @property
    def steady(self) -> SteadyWindow:
        return steady_window(
            steps=self.steps, batches_per_pass=self.batches_per_pass, passes=self.passes
        )

    def evaluates_after(self, updates: int) -> bool:
        every = self.eval_every_steps
        return (
            bool(every and updates % every == 0)
            or updates in self.eval_at_updates
            or updates == self.steps
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class HalvesSpec:
    """What builds a host's rollout half and trainer half (`placement.build`): their sub-configs
    and step settings."""

    model: ModelConfig
    algo: AlgoConfig
    trainer: TrainerConfig  # micro_batch_rows resolved by the plan
    rollout: RolloutConfig  # capacity resolved by the plan
    dataset: DatasetConfig
    settings: StepSettings
    sampler_dtype: DType  # the engines' weights: rollout.param_dtype, else the model's (Table I3)
    adapter: AdapterConfig  # what the trainer updates (adapter=lora: the adapters only)
