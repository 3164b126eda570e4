"""The memory plan: per-device bytes of the trainer and the rollout engine on the run's hardware.

It reads the model, dataset, trainer, rollout and hardware sub-configs and the run's
`locoexp.layout.Layout` (never the root config), resolves `trainer.micro_batch_rows=0` and
`rollout.capacity=0` to concrete sizes, refuses what does not fit and prints the dry-run report.
Modules: `estimate` (bytes by term), `plan` (roles on hardware, the fit of one candidate), `fit`
(resolution and refusal), `pages` (a paged engine's pool and the slots it holds), `report` (the
dry-run text). Nothing here allocates.
"""

from locoexp.planner.fit import (
    check_fit,
    check_tensor_parallel,
    paper_layout,
    resolve_plan,
    resolved_micro_batch_rows,
)
from locoexp.planner.plan import Plan, Setup
from locoexp.planner.report import describe_plan

__all__ = [
    "Plan",
    "Setup",
    "check_fit",
    "check_tensor_parallel",
    "describe_plan",
    "paper_layout",
    "resolve_plan",
    "resolved_micro_batch_rows",
]
