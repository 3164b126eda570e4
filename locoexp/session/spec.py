"""`RunSpec`: everything a run executes, built once from the root `Config` and checked.

Frozen and jax-free, so start-up checks (`locoexp.preflight`), the dry run, tools and tests take a
`RunSpec` instead of the root config, and the launcher hands the same value to every host process
(and Ray ships its halves' factories to the actors). It holds:

- `layout`: who runs where (`locoexp.layout.Layout`: hosts, processes, devices, roles,
  staleness, the transport that carries a step);
- `ray`: the Ray cluster of a disaggregated layout (`placement.ray.spec.RaySpec`: its address,
  restarts, object store), read by the Ray transport alone; None when colocated;
- `coordinator`: where the processes meet (`placement.coordinator.CoordinatorSpec`: the
  jax.distributed coordinator, the bind address), read by what starts or joins them;
- `loop`: the step loop's plan (steps, staleness, evaluation, O1/O2, cost-to-learn);
- `halves`: what builds the two halves of a step (their sub-configs and step settings, with the
  trainer's micro-batch and the engine's capacity resolved by the memory plan);
- `survival`: how the run survives (checkpoint cadence, exports, resume mode, config digest);
- the records: the logger and the steps each host profiles.

`session.build` makes it (`build_spec`); it and `locoexp.main` are the only readers of the root
`Config`: everything downstream receives a `RunSpec` or one of its parts.
"""

import dataclasses

from locoexp.checkpoint.config import ResumeMode
from locoexp.layout import Layout
from locoexp.metrics.config import LoggerConfig
from locoexp.placement.coordinator import CoordinatorSpec
from locoexp.placement.ray.spec import RaySpec
from locoexp.placement.settings import HalvesSpec, LoopPlan


@dataclasses.dataclass(frozen=True, kw_only=True)
class SurvivalSpec:
    """How the run survives: `checkpoint.session.RunSurvival` opens with it."""

    resume: ResumeMode
    checkpoint_every_steps: int  # 0 = only at the end and on a stop
    steps: int
    seed: int
    export_at: frozenset[int]  # updates after which the policy is exported (eval_at_updates)
    config_digest: str  # the config a checkpoint must match (`checkpoint.progress.config_digest`)
    # ask JAX at each step whether the TPU slice is being preempted (every host of a
    # jax.distributed group reaches the same answer; a da driver is in none)
    preemption_sync: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSpec:
    layout: Layout
    ray: RaySpec | None  # disaggregated layouts only
    coordinator: CoordinatorSpec
    loop: LoopPlan
    halves: HalvesSpec
    survival: SurvivalSpec
    logger: LoggerConfig
    profile_steps: frozenset[int]  # steps each host traces (`profile_steps`)
