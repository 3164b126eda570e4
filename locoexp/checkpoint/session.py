"""A run's checkpoints as its step loop uses them: whether it resumes, what it restores, when it
saves, and where the policy is exported. Every host holds one and calls it at the same steps
(under `placement=da` the Ray driver holds it; its trainer hosts write the arrays).

This module only sequences `state.RunCheckpoints` and `export.export_policy` and builds each
checkpoint's `RunProgress`; the transport writes it with its arrays. The loop decides nothing
about files, and this module nothing about steps.
"""

import dataclasses
from pathlib import Path
from typing import Any

from locoexp.checkpoint.config import ResumeMode
from locoexp.checkpoint.export import export_policy, policy_directory
from locoexp.checkpoint.progress import RunProgress
from locoexp.checkpoint.state import (
    RunCheckpoints,
    check_same_config,
    resume_step,
)
from locoexp.metrics.cost import Checkpoint


@dataclasses.dataclass(kw_only=True)
class RunSurvival:
    checkpoints: RunCheckpoints
    run_dir: Path
    every_steps: int  # checkpoint period; 0 = only at the end and on a stop
    steps: int
    seed: int
    digest: str  # the config a checkpoint must match (`state.config_digest`)
    export_at: frozenset[int]  # updates after which the policy is exported (eval_at_updates)
    restored: RunProgress | None  # the checkpoint this run resumes from, or None

    @classmethod
    def open(
        cls,
        run_dir: str | Path,
        *,
        mode: ResumeMode,
        every_steps: int,
        steps: int,
        seed: int,
        digest: str,
        export_at: frozenset[int],
    ) -> "RunSurvival":
        checkpoints = RunCheckpoints(run_dir)
        step = resume_step(mode, checkpoints.latest_step(), checkpoints.directory)
        restored = None
        if step is not None:
            restored = checkpoints.read_progress(step)
            check_same_config(restored, digest, checkpoints.directory)
        return cls(
            checkpoints=checkpoints,
            run_dir=Path(run_dir),
            every_steps=every_steps,
            steps=steps,
            seed=seed,
            digest=digest,
            export_at=export_at,
            restored=restored,
        )

    @property
    def start_step(self) -> int:
        return 0 if self.restored is None else self.restored.next_step

    @property
    def completed(self) -> bool:
        return self.restored is not None and self.restored.next_step >= self.steps

    def restore(self, like: Any) -> Any:
        """The restored checkpoint's arrays, placed like the live arrays `like`."""
        assert self.restored is not None, "restore() follows a restored run's start_step"
        _, arrays = self.checkpoints.restore(self.restored.next_step, like)
        return arrays

    def saves_after(self, updates: int) -> bool:
        every = self.every_steps
        return updates == self.steps or bool(every and updates % every == 0)

    def progress(
        self,
        *,
        updates: int,
        elapsed_s: float,
        eval_total_s: float,
        scored: list[Checkpoint],
        resumed_at_s: float,
    ) -> RunProgress:
        """The host-side state of a checkpoint after `updates` steps (the transport saves it with
        its arrays). `resumed_at_s`: this attempt's clock at its start (the restored checkpoint's
        elapsed time plus the lost attempt's redone seconds)."""
        before = self.restored
        return RunProgress(
            next_step=updates,
            seed=self.seed,
            elapsed_s=elapsed_s,
            eval_total_s=eval_total_s,
            scored=tuple(scored),
            attempts=1 if before is None else before.attempts + 1,
            lost_wall_s=0.0
            if before is None
            else before.lost_wall_s + resumed_at_s - before.elapsed_s,
            config_digest=self.digest,
        )

    def export(self, params, graphdef, model, tokenizer, *, updates: int | None) -> Path | None:
        """The policy as a Hugging Face directory (every host calls; process 0 writes)."""
        return export_policy(
            params, graphdef, model, tokenizer, policy_directory(self.run_dir, updates=updates)
        )

    def close(self) -> None:
        self.checkpoints.close()
