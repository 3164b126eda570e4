"""`require_finite_step`: stop a run at the first step whose loss or gradient is not finite.

A NaN or inf loss poisons every later step (AdamW's moments keep it), so training on would only
spend compute on NaN; the step loop calls this on the trainer's host-side metrics after each
step and the run ends with one sentence naming the step. This module reads floats the trainer
already returned: it must not touch device arrays (no extra host-device sync per step).
"""

import math
from collections.abc import Mapping

from locoexp.errors import TrainingDiverged

WATCHED = ("train/loss", "train/grad_norm")  # the trainer's metrics (locoexp/trainer/trainer.py)


def require_finite_step(
    metrics: Mapping[str, float], *, step: int, last_checkpoint: str | None = None
) -> None:
    """Raise `TrainingDiverged` when a watched metric of step `step` (0-based, as in
    metrics.jsonl) is NaN or infinite; `last_checkpoint` names where to resume from."""
    bad = [f"{key}={metrics[key]}" for key in WATCHED if not math.isfinite(metrics.get(key, 0.0))]
    if not bad:
        return
    resume = (
        f"the last good checkpoint is {last_checkpoint}"
        if last_checkpoint
        else "no checkpoint of an earlier step was written"
    )
    raise TrainingDiverged(
        f"step {step}: {' and '.join(bad)} is not finite, so the run stops ({resume}); rerun "
        "with a smaller algo.learning_rate, or with gradient clipping on (algo.max_grad_norm=1.0)."
    )
