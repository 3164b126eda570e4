"""The typed root `Config`: one field per config group plus the run-level keys.

`run.py` composes YAML with Hydra and converts it into this dataclass; everything below
`locoexp.main` receives only the sub-config or runtime object it needs. Cross-group invariants
(placement vs split, batch vs hosts) are checked here, so a bad run fails before anything is
allocated or written.
"""

import dataclasses

from locoexp.algo.config import AlgoConfig
from locoexp.dataset.config import DatasetConfig
from locoexp.errors import require
from locoexp.hardware.config import HardwareConfig
from locoexp.metrics.config import LoggerConfig
from locoexp.model.config import ModelConfig
from locoexp.placement.config import OptConfig, PlacementConfig, PlacementKind
from locoexp.rollout.config import RolloutConfig
from locoexp.trainer.config import TrainerConfig


@dataclasses.dataclass(kw_only=True)
class Config:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    dataset: DatasetConfig = dataclasses.field(default_factory=DatasetConfig)
    hardware: HardwareConfig = dataclasses.field(default_factory=HardwareConfig)
    placement: PlacementConfig = dataclasses.field(default_factory=PlacementConfig)
    opt: OptConfig = dataclasses.field(default_factory=OptConfig)
    algo: AlgoConfig = dataclasses.field(default_factory=AlgoConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    logger: LoggerConfig = dataclasses.field(default_factory=LoggerConfig)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    # placement=da: the trainer's share of the hosts (the paper's splits: 0.5, 0.25, 0.125).
    split: float | None = None
    seed: int = 0  # model init and sampling
    steps: int = 150  # optimizer updates (one per batch)
    eval_every_steps: int = 25  # held-out evaluation period; 0 = only after the last step
    # Scored checkpoints by update count, as Table I3's [275, 300, 325, 348]; added to the above.
    eval_at_updates: list[int] = dataclasses.field(default_factory=list)
    # Cost-to-learn (Appendix I.1): held-out accuracy that two consecutive evaluations must reach.
    eval_target: float = 0.9
    dry_run: bool = False  # print the plan (hosts, devices, memory, parameters) and exit
    # Steps (0-based) to capture with `jax.profiler` and split into compute / network / host
    # orchestration (Table H1; `breakdown/*_share` in the records). Traces stay in
    # `<run_dir>/profile/step<t>/` for TensorBoard and Perfetto; capture and parsing are kept off
    # the step clock. Each host profiles its own process.
    profile_steps: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        require(self.steps >= 1, f"steps={self.steps} must be a positive integer.")
        require(
            self.eval_every_steps >= 0, f"eval_every_steps={self.eval_every_steps} must be >= 0."
        )
        require(0 < self.eval_target <= 1, f"eval_target={self.eval_target} must be in (0, 1].")
        require(
            all(1 <= u <= self.steps for u in self.eval_at_updates),
            f"eval_at_updates={self.eval_at_updates} must lie in [1, steps={self.steps}].",
        )
        require(
            all(0 <= t < self.steps for t in self.profile_steps),
            f"profile_steps={self.profile_steps} must lie in [0, steps={self.steps}).",
        )
        require(
            not self.profile_steps or self.placement.kind is not PlacementKind.da,
            f"profile_steps={self.profile_steps} is not supported under placement=da yet; "
            "profile placement=co or single_controller.",
        )
        hosts = self.hardware.hosts
        if self.placement.kind is not PlacementKind.da:
            require(
                self.split is None,
                f"split={self.split} only applies to placement=da, not "
                f"placement={self.placement.kind.value}; "
                "remove it or set placement=da.",
            )
        else:
            valid = valid_splits(hosts)
            shown = ", ".join(str(v) for v in valid) or "none (placement=da needs at least 2 hosts)"
            require(
                self.split is not None,
                f"placement=da needs split=<the trainer's share of hosts>; valid splits for "
                f"{hosts} "
                f"hosts: {shown}.",
            )
            require(
                self.split in valid,
                f"split={self.split} with hardware.hosts={hosts} does not give whole, non-zero "
                "trainer "
                f"and rollout host counts; valid splits for {hosts} hosts: "
                f"{shown}.",
            )
        if self.placement.kind is PlacementKind.co:
            require(
                self.dataset.prompts_per_step % hosts == 0,
                f"dataset.prompts_per_step={self.dataset.prompts_per_step} must be divisible by "
                f"hardware.hosts={hosts}: each host admits whole GRPO groups (Algorithm 1).",
            )


def valid_splits(hosts: int) -> list[float]:
    """Trainer shares of `hosts` that leave whole, non-zero host counts on both sides."""
    return [t / hosts for t in range(1, hosts)]
