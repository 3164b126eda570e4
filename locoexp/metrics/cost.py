"""Cost-to-learn in chip-hours (paper Appendix I.1), as pure functions over scored checkpoints.

The rule: a run is charged at the first of two consecutive scored checkpoints whose score clears
the target (score >= target, as Table I3's "3-seed sum >= 3,364 of 3,957"); its cost is
chips x wall time from job start to that checkpoint, start-up included, evaluation excluded. A
target cleared only at the last checkpoint, or never twice in a row, is "not reached".
A cell of several seeds (Appendix I.1) pools their scores per checkpoint, is charged at the pooled
rule's checkpoint for every seed, and sums the seeds' chip-hours.

This module reads records, never clocks or devices: `time/elapsed_s` must already exclude eval.
"""

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

SECONDS_PER_HOUR = 3600.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkpoint:
    step: int  # global step (0-based) after whose update the policy was scored
    elapsed_s: float  # wall seconds from job start to this checkpoint, evaluation excluded
    score: float  # held-out score, in the target's units (e.g. accuracy in [0, 1])


@dataclasses.dataclass(frozen=True, kw_only=True)
class CostToLearn:
    target: float
    reached: bool
    charged_step: int | None = None  # the first checkpoint of the clearing pair
    elapsed_s: float | None = None  # summed over seeds for a cell
    chip_hours: float | None = None
    usd: float | None = None  # None when not reached or the hardware is unpriced

    def as_metrics(self) -> dict[str, float | int | bool | str]:
        """The `cost/*` summary keys; "not reached" leaves only `cost/status` and the target."""
        metrics = {
            "cost/target": self.target,
            "cost/reached": self.reached,
            "cost/status": "reached" if self.reached else "not reached",
        }
        optional = {
            "cost/charged_step": self.charged_step,
            "cost/elapsed_s": self.elapsed_s,
            "cost/chip_hours": self.chip_hours,
            "cost/usd": self.usd,
        }
        metrics.update({key: value for key, value in optional.items() if value is not None})
        return metrics


def find_charged_index(scores: Sequence[float], *, target: float) -> int | None:
    """Index of the first of two consecutive scores that both clear `target`, or None."""
    for i in range(len(scores) - 1):
        if scores[i] >= target and scores[i + 1] >= target:
            return i
    return None


def compute_cost_to_learn(
    checkpoints: Sequence[Checkpoint], *, target: float, chips: int, chip_hour_price_usd: float
) -> CostToLearn:
    """One run's cost-to-learn (Appendix I.1). `chip_hour_price_usd=0` means unpriced."""
    return compute_cell_cost_to_learn(
        [checkpoints], target=target, chips=chips, chip_hour_price_usd=chip_hour_price_usd
    )


def compute_cell_cost_to_learn(
    seeds: Sequence[Sequence[Checkpoint]], *, target: float, chips: int, chip_hour_price_usd: float
) -> CostToLearn:
    """A cell's cost-to-learn: seeds scored at the same steps, pooled by mean score (equal
    held-out sets, as in Table I3), charged at one checkpoint, chip-hours summed over seeds."""
    if chips < 1 or chip_hour_price_usd < 0:
        raise ValueError(
            f"chips={chips} must be >= 1 and chip_hour_price_usd={chip_hour_price_usd} >= 0."
        )
    if not seeds:
        raise ValueError("compute_cell_cost_to_learn needs at least one seed's checkpoints.")
    steps = [c.step for c in seeds[0]]
    for seed, checkpoints in enumerate(seeds):
        _check_checkpoints(checkpoints)
        if [c.step for c in checkpoints] != steps:
            raise ValueError(
                f"seed {seed} is scored at steps {[c.step for c in checkpoints]}, "
                f"seed 0 at {steps}: a cell's seeds must share their checkpoints."
            )
    pooled = [sum(s[i].score for s in seeds) / len(seeds) for i in range(len(steps))]
    index = find_charged_index(pooled, target=target)
    if index is None:
        return CostToLearn(target=target, reached=False)
    elapsed_s = sum(checkpoints[index].elapsed_s for checkpoints in seeds)
    chip_hours = chips * elapsed_s / SECONDS_PER_HOUR
    usd = chip_hours * chip_hour_price_usd if chip_hour_price_usd > 0 else None
    return CostToLearn(
        target=target,
        reached=True,
        charged_step=steps[index],
        elapsed_s=elapsed_s,
        chip_hours=chip_hours,
        usd=usd,
    )


def _check_checkpoints(checkpoints: Sequence[Checkpoint]) -> None:
    for before, after in zip(checkpoints, checkpoints[1:], strict=False):
        if after.step <= before.step or after.elapsed_s < before.elapsed_s:
            raise ValueError(
                f"checkpoints must rise in step and elapsed time: step {before.step} "
                f"at {before.elapsed_s} s is followed by step {after.step} at "
                f"{after.elapsed_s} s."
            )


def resumed_elapsed_s(checkpoint_elapsed_s: float, dropped: Iterable[Mapping]) -> float:
    """The Appendix I.1 clock at the start of a resumed attempt.

    App. I.1 charges "chips x wall time from job start", start-up included and only queueing and
    evaluation excluded. Applied to a run that died and resumed: the lost attempt's steps after
    its last checkpoint held the chips and are redone, so their wall time counts (up to the last
    record the lost attempt wrote: the seconds between that record and its death are unknown and
    not counted); the time between the death and the restart is queueing and does not count; the
    resumed attempt's own start-up counts. So the resumed clock starts from the lost attempt's
    last recorded elapsed time, not from the checkpoint's.
    """
    recorded = [float(r["time/elapsed_s"]) for r in dropped if "time/elapsed_s" in r]
    return max([checkpoint_elapsed_s, *recorded])


def checkpoints_from_records(
    records: Iterable[Mapping], *, score_key: str = "eval/accuracy"
) -> list[Checkpoint]:
    """Scored checkpoints from metrics.jsonl records.

    An eval record carries `step` and `score_key`; its elapsed time is its own `time/elapsed_s`
    when present, else that of the step record with the same `step` (the update it scored).
    """
    records = list(records)
    step_elapsed = {
        r["step"]: r["time/elapsed_s"]
        for r in records
        if "time/elapsed_s" in r and score_key not in r
    }
    checkpoints = []
    for record in records:
        if score_key not in record:
            continue
        step = int(record["step"])
        elapsed_s = record.get("time/elapsed_s", step_elapsed.get(step))
        if elapsed_s is None:
            raise ValueError(
                f"eval record at step {step} has no time/elapsed_s and no step "
                f"record at step {step} gives one."
            )
        checkpoints.append(
            Checkpoint(step=step, elapsed_s=float(elapsed_s), score=float(record[score_key]))
        )
    return sorted(checkpoints, key=lambda c: c.step)
