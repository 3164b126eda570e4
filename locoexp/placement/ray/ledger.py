"""`BatchLedger`: under `placement=da`, each step's batch is trained exactly once with exactly
its scheduled prompts and weights no more than `placement.max_staleness` updates old, and every
rollout host restart is recorded (`batches.jsonl`).

Rows are typed (`checkpoint.progress.TrainedBatch`, `RolloutRestart`); a checkpoint carries
them in its `RunProgress`, and a resumed run's ledger starts from them (the file is rewritten to
them, as `metrics.jsonl` is cut back, so a step redone after a loss appears once). Neither Ray
nor JAX: the driver holds it, the transport (`transport.py`) feeds it.
"""

import contextlib
import json
from pathlib import Path

from locoexp.checkpoint.progress import LedgerRow, RolloutRestart, TrainedBatch
from locoexp.dataset.schedule import PromptSchedule
from locoexp.errors import unwritable
from locoexp.placement.halves import TrainResult


class BatchLedger:
    def __init__(
        self,
        schedule: PromptSchedule,
        example_ids: list[int],
        path: Path,
        *,
        max_staleness: int = 1,
        rows: tuple[LedgerRow, ...] = (),
    ):
        self.schedule, self.example_ids = schedule, example_ids
        self.max_staleness = max_staleness
        self.rows: list[LedgerRow] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._file = path.open("w", encoding="utf-8")
        for row in rows:
            self._write(row)

    @property
    def trained(self) -> list[int]:
        """The steps trained so far, in order."""
        return [r.step for r in self.rows if isinstance(r, TrainedBatch)]

    def record(self, result: TrainResult) -> None:
        step, trained_ids = result.step, list(result.example_ids)
        scheduled = [self.example_ids[i] for i in self.schedule.batch(step)]
        if step in self.trained or sorted(trained_ids) != sorted(scheduled):
            raise RuntimeError(
                f"step {step}: trained prompts {sorted(trained_ids)} are not batch {step}'s "
                f"{sorted(scheduled)} exactly once (already trained: {step in self.trained})"
            )
        oldest = step - self.max_staleness  # the trainer has applied `step` updates
        if min(result.versions) < oldest:
            raise RuntimeError(
                f"step {step}: trained a batch sampled with weights of update "
                f"{min(result.versions)}, older than placement.max_staleness="
                f"{self.max_staleness} allows (>= {oldest})"
            )
        row = TrainedBatch(
            step=step,
            example_ids=tuple(trained_ids),
            weight_versions=tuple(result.versions),
            rollout_windows=tuple((w.start, w.end) for w in result.windows),
        )
        self._write(row)

    def record_restart(self, *, host: int, step: int, regenerated: str, weight_version: int):
        """Rollout host `host` was restarted while it worked on `regenerated` for step `step`,
        which it did again with the weights of `weight_version` updates."""
        row = RolloutRestart(
            host=host, step=step, regenerated=regenerated, weight_version=weight_version
        )
        self._write(row)

    def restarts(self, host: int | None = None) -> int:
        """Restarts so far (of rollout host `host`; of every host when None)."""
        return sum(isinstance(r, RolloutRestart) and host in (None, r.host) for r in self.rows)

    def _write(self, row: LedgerRow) -> None:
        self.rows.append(row)
        try:
            self._file.write(json.dumps(row.to_json()) + "\n")
            self._file.flush()
        except OSError as error:  # a full disk: the rows are in the checkpoints too
            kept = (
                "its earlier rows are intact, and every checkpoint holds the rows up to its step "
                "(a resumed run rewrites the file from them)"
            )
            raise unwritable(self._path, error, kept=kept) from None

    def close(self) -> None:
        # every row was flushed as written, so only the row `_write` reported can be pending;
        # its error must not replace that sentence while the run ends
        with contextlib.suppress(OSError):
            self._file.close()
