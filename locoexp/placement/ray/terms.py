"""What a stale schedule adds to each step's record, measured by the Ray transport that runs it:
Eq. 4's A (`timing/straggler_absorbed_s`, the straggler wait that staleness absorbs) and the
overlap of step t's training with batch t+1's rollout (`timing/overlap_s`, `_share`).

`ScheduleTerms` keeps the windows these need (every rollout host's for each batch collected in
this attempt, every trainer host's for each step trained) until step t's record is out, and
then forgets them. The loop keeps only the schedule; every placement's own straggler
(`timing/straggler_s`, the slowest host's lead over the mean) stays the loop's. Clocks are the
hosts' wall clocks (one machine, or synchronised machines).
"""

import dataclasses

from locoexp.placement.halves import HalfReport, TrainResult


@dataclasses.dataclass
class ScheduleTerms:
    # every rollout host's report of each batch collected in this attempt, until its record
    # and the next one are out (batch t's end is where batch t+1's A starts)
    reports: dict[int, list[HalfReport]] = dataclasses.field(default_factory=dict)
    trained: dict[int, list[TrainResult]] = dataclasses.field(default_factory=dict)

    def record_of(self, step: int) -> dict[str, float]:
        """Step `step`'s terms, once batch `step + 1` (if started) has been collected."""
        return {
            **absorbed(self.reports[step], previous=self.reports.pop(step - 1, None)),
            **overlap(self.trained.pop(step), self.reports.get(step + 1)),
        }


def absorbed(reports: list[HalfReport], *, previous: list[HalfReport] | None) -> dict[str, float]:
    """Eq. 4's A for a batch: how much of its slowest host's rollout time the schedule did not
    wait for. A synchronous schedule starts batch t when batch t-1 is complete on every host and
    ends it a slowest-host's time later; here each host starts its share when its own previous
    share is done, so batch t completes `end(t) - end(t-1)` after batch t-1:
    A = max(0, slowest - that). `previous`: batch t-1's reports (None: the attempt's first)."""
    end = max(r.window.end for r in reports)
    slowest = max(r.window.end - r.window.start for r in reports)
    waited = slowest if previous is None else end - max(r.window.end for r in previous)
    return {"timing/straggler_absorbed_s": max(0.0, slowest - waited)}


def overlap(trained: list[TrainResult], next_reports: list[HalfReport] | None) -> dict[str, float]:
    """How long step t's training (transfer to publish) ran alongside batch t+1's rollout."""
    start = min(t.report.window.start for t in trained)
    end = max(t.report.window.end for t in trained)
    seconds = 0.0
    if next_reports:
        r_start = min(r.window.start for r in next_reports)
        r_end = max(r.window.end for r in next_reports)
        seconds = max(0.0, min(end, r_end) - max(start, r_start))
    return {"timing/overlap_s": seconds, "timing/overlap_share": seconds / max(end - start, 1e-9)}
