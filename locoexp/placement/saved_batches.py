"""The already generated next batch of a `placement=da` checkpoint, as plain files.

With staleness 1 (Section 2, LoCoJAX-DA) batch k is sampled during step k-1 with the weights
after step k-2. A checkpoint after k updates holds the weights after step k-1 only, so a resumed
run could not sample batch k again as the uninterrupted run did; instead the driver saves batch k
itself (token ids, behaviour log-probs, advantages and each rollout host's report: small arrays)
next to the checkpoint, and the resumed run trains exactly that batch at step k.

Files: `<run_dir>/da_batches/<k>.npz`, one per checkpoint step, written (atomically) before the
checkpoint it belongs to, numpy arrays only (no pickle); one that cannot be written (a full disk)
stops the run with one sentence, no partial file left. This module owns the encoding; it never
decides when to save (the transport does, when the loop checkpoints).
"""

import json
import os
from pathlib import Path

import numpy as np

from locoexp.errors import ConfigError
from locoexp.placement.halves import HalfReport, RolloutBatch, Window

BATCH_DIR = "da_batches"


def batch_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / BATCH_DIR / f"{step}.npz"


def save_batches(run_dir: str | Path, step: int, batches: list[RolloutBatch]) -> Path:
    """Every rollout host's share of batch `step` in one file (renamed into place when done)."""
    arrays: dict[str, np.ndarray] = {"hosts": np.array(len(batches))}
    for host, batch in enumerate(batches):
        arrays |= _encode(batch, prefix=f"{host}/")
    path = batch_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npz")
    try:
        np.savez(partial, **arrays)
        os.replace(partial, path)
    except OSError as error:  # a full disk: the run stops with the last checkpoint intact
        partial.unlink(missing_ok=True)
        raise ConfigError(
            f"batch {step} of the next checkpoint could not be written to {path} "
            f"({error.strerror}); the last complete checkpoint is intact: free space or move "
            "the run directory, then rerun the same command to resume."
        ) from None
    return path


def load_batches(run_dir: str | Path, step: int) -> list[RolloutBatch] | None:
    """Batch `step` as saved by `save_batches`, or None when no file holds it."""
    path = batch_path(run_dir, step)
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as saved:
        arrays = dict(saved)
    return [_decode(arrays, prefix=f"{host}/") for host in range(int(arrays["hosts"]))]


def prune_batches(run_dir: str | Path, *, kept: set[int]) -> None:
    """Remove every file whose step is not in `kept` (the checkpoints on disk and the one being
    written): those of checkpoints deleted since, and those of a checkpoint that was never
    completed (a run killed or refused mid-save), which no resume reads."""
    for path in (Path(run_dir) / BATCH_DIR).glob("*.npz"):
        stem = path.name.removesuffix(".npz")
        if stem.isdigit() and int(stem) not in kept:
            path.unlink(missing_ok=True)


def _encode(batch: RolloutBatch, *, prefix: str) -> dict[str, np.ndarray]:
    meta = {
        "step": batch.step,
        "weight_version": batch.weight_version,
        "metrics": batch.report.metrics,
        "window": [batch.report.window.start, batch.report.window.end],
    }
    out = {
        f"{prefix}meta": np.array(json.dumps(meta)),
        f"{prefix}example_ids": np.asarray(batch.example_ids, np.int64),
        f"{prefix}advantages": batch.advantages,
    }
    for name in ("prompts", "completions", "behaviour_logprobs"):
        ragged = [np.asarray(x) for x in getattr(batch, name)]
        out[f"{prefix}{name}"] = np.concatenate(ragged)
        out[f"{prefix}{name}_lengths"] = np.array([len(x) for x in ragged], np.int64)
    return out


def _decode(arrays: dict[str, np.ndarray], *, prefix: str) -> RolloutBatch:
    meta = json.loads(str(arrays[f"{prefix}meta"]))

    def ragged(name: str) -> tuple[np.ndarray, ...]:
        ends = np.cumsum(arrays[f"{prefix}{name}_lengths"])
        return tuple(np.split(arrays[f"{prefix}{name}"], ends[:-1]))

    return RolloutBatch(
        step=meta["step"],
        weight_version=meta["weight_version"],
        example_ids=tuple(int(i) for i in arrays[f"{prefix}example_ids"]),
        prompts=ragged("prompts"),
        completions=ragged("completions"),
        behaviour_logprobs=ragged("behaviour_logprobs"),
        advantages=arrays[f"{prefix}advantages"],
        report=HalfReport(meta["metrics"], Window(*meta["window"])),
    )
