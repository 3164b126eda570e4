"""`RunProgress`: the host-side state a training-state checkpoint holds beside its arrays, and
the typed rows of `placement=da`'s batch ledger it carries.

Plain, frozen and jax-free: a Ray driver hands it to its trainer hosts as it is, orbax stores
it as JSON (`to_json` / `from_json`), and `batches.jsonl` holds the same rows. This module never
reads or writes a file.
"""

import dataclasses
import json
from typing import Any

from locoexp.metrics.cost import Checkpoint

RESTART = "rollout_restart"  # the `event` of a restart row in batches.jsonl


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainedBatch:
    """Step `step` trained the prompts `example_ids`, sampled with `weight_versions` (one per
    rollout host's share)."""

    step: int
    example_ids: tuple[int, ...]
    weight_versions: tuple[int, ...]
    # each share's generation, (start, end) wall time on its rollout host: hosts at their own
    # pace start batch t+1 before others finish batch t
    rollout_windows: tuple[tuple[float, float], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "example_ids": list(self.example_ids),
            "weight_versions": list(self.weight_versions),
            "rollout_windows": [list(w) for w in self.rollout_windows],
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutRestart:
    """Rollout host `host` was restarted while it worked on `regenerated` ("batch" or
    "evaluation") of step `step`, which it did again with the weights of `weight_version`."""

    host: int
    step: int
    regenerated: str
    weight_version: int

    def to_json(self) -> dict[str, Any]:
        return {"event": RESTART, **dataclasses.asdict(self)}


LedgerRow = TrainedBatch | RolloutRestart


def ledger_row(data: dict[str, Any]) -> LedgerRow:
    """A row of batches.jsonl (or of a checkpoint's ledger) as its type."""
    if data.get("event") == RESTART:
        return RolloutRestart(**{k: v for k, v in data.items() if k != "event"})
    return TrainedBatch(
        step=data["step"],
        example_ids=tuple(data["example_ids"]),
        weight_versions=tuple(data["weight_versions"]),
        rollout_windows=tuple(tuple(w) for w in data.get("rollout_windows", ())),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunProgress:
    """The host-side state of a run after `next_step` updates (steps 0..next_step-1 done)."""

    # The next step to run. PromptSchedule.batch(t) and every sampling key
    # (fold_in(key(seed), t, host)) are pure functions of (seed, t), so (seed, next_step) restores
    # the prompt-schedule position and the RNG state exactly.
    next_step: int
    seed: int
    # Appendix I.1's clock: wall seconds from job start to the end of step next_step-1, evaluation
    # excluded, summed over every attempt of the run (see `lost_wall_s`).
    elapsed_s: float
    eval_total_s: float  # evaluation wall seconds so far (kept off the clock)
    scored: tuple[Checkpoint, ...] = ()  # the scored checkpoints so far, for cost-to-learn
    attempts: int = 1  # processes that ran this run (1 + resumes)
    lost_wall_s: float = 0.0  # wall seconds of steps redone after a loss (counted, App. I.1)
    weight_version: int | None = None  # placement=da: updates in the published weights
    ledger: tuple[LedgerRow, ...] = ()  # placement=da: the batch ledger's rows so far
    config_digest: str = ""  # the run's config without the keys a resume may change

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["scored"] = [dataclasses.asdict(c) for c in self.scored]
        data["ledger"] = [row.to_json() for row in self.ledger]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RunProgress":
        data = dict(data)
        data["scored"] = tuple(Checkpoint(**c) for c in data["scored"])
        data["ledger"] = tuple(ledger_row(row) for row in data["ledger"])
        return cls(**data)


# Keys a resumed run may change: how long it runs, how it checkpoints and logs, not what it trains.
RESUMABLE_KEYS = ("steps", "resume", "checkpoint_every_steps", "logger", "dry_run", "hydra")


def config_digest(resolved: dict[str, Any]) -> str:
    """A stable text of the resolved config without `RESUMABLE_KEYS`, to compare on resume."""
    kept = {k: v for k, v in resolved.items() if k not in RESUMABLE_KEYS}
    return json.dumps(kept, sort_keys=True, default=str)
