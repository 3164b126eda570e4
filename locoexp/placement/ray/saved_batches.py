"""The batches in flight at a `placement=da` checkpoint, as plain files.

With staleness s (Section 2, LoCoJAX-DA; `placement.max_staleness`) batch j is sampled with the
weights after update max(j - s, 0). A checkpoint after k updates holds the weights after update k
only, so a resumed run could not sample batches k .. k+s-1 again as the uninterrupted run did
(with the weights after updates k-s .. k-1); instead the driver saves those batches themselves
(token ids, behaviour log-probs, advantages, each rollout host's report and the weight version
that sampled it: small arrays) with the checkpoint, and the resumed run trains exactly those
batches at steps k .. k+s-1. Batch k+s and later are sampled with the restored weights, as the
uninterrupted run sampled them.

Files: `<run_dir>/da_batches/<k>/<j>.npz`, one directory per checkpoint k and one file per batch
j it saved, each written (atomically) before the checkpoint it belongs to, numpy arrays only (no
pickle); one that cannot be written (a full disk) stops the run with one sentence, no partial
file left. A checkpoint's directory goes when its checkpoint does (`prune_batches`). A run
directory of an earlier version holds `<run_dir>/da_batches/<k>.npz`, batch k alone, which is
read as checkpoint k's. This module owns the encoding; it never decides when to save (the
transport does, when the loop checkpoints).
"""

import json
import os
import shutil
from pathlib import Path

import numpy as np

from locoexp.errors import ConfigError
from locoexp.placement.halves import HalfReport, RolloutBatch, Window

BATCH_DIR = "da_batches"


def batch_path(run_dir: str | Path, checkpoint: int, step: int) -> Path:
    """Where the checkpoint after `checkpoint` updates keeps batch `step`."""
    return Path(run_dir) / BATCH_DIR / str(checkpoint) / f"{step}.npz"


def clear_batches(run_dir: str | Path, checkpoint: int) -> None:
    """Remove what an earlier attempt left for the checkpoint after `checkpoint` updates (one
    killed before that checkpoint was complete), so that it holds only what is saved next."""
    shutil.rmtree(Path(run_dir) / BATCH_DIR / str(checkpoint), ignore_errors=True)


def save_batches(
    run_dir: str | Path, checkpoint: int, step: int, batches: list[RolloutBatch]
) -> Path:
    """Every rollout host's share of batch `step` in one file of the checkpoint after
    `checkpoint` updates (renamed into place when done)."""
    arrays: dict[str, np.ndarray] = {"hosts": np.array(len(batches))}
    for host, batch in enumerate(batches):
        arrays |= _encode(batch, prefix=f"{host}/")
    path = batch_path(run_dir, checkpoint, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npz")
    try:
        # numpy's stub matches **arrays against savez's allow_pickle keyword
        np.savez(partial, **arrays)  # type: ignore[arg-type]
        os.replace(partial, path)
    except OSError as error:  # a full disk: the run stops with the last checkpoint intact
        partial.unlink(missing_ok=True)
        raise ConfigError(
            f"batch {step} of the next checkpoint could not be written to {path} "
            f"({error.strerror}); the last complete checkpoint is intact: free space or move "
            "the run directory, then rerun the same command to resume."
        ) from None
    return path


def load_batches(run_dir: str | Path, checkpoint: int) -> dict[int, list[RolloutBatch]]:
    """Every batch the checkpoint after `checkpoint` updates saved, by step (none: {})."""
    directory = Path(run_dir) / BATCH_DIR
    paths = {
        int(p.stem): p for p in (directory / str(checkpoint)).glob("*.npz") if p.stem.isdigit()
    }
    if not paths and (directory / f"{checkpoint}.npz").is_file():  # an earlier version's
        paths = {checkpoint: directory / f"{checkpoint}.npz"}
    return {step: _load(path) for step, path in sorted(paths.items())}


def _load(path: Path) -> list[RolloutBatch]:
    with np.load(path, allow_pickle=False) as saved:
        arrays = dict(saved)
    return [_decode(arrays, prefix=f"{host}/") for host in range(int(arrays["hosts"]))]


def prune_batches(run_dir: str | Path, *, kept: set[int]) -> None:
    """Remove the batches of every checkpoint not in `kept` (those on disk and the one being
    written): of checkpoints deleted since, and of a checkpoint never completed (a run killed or
    refused mid-save), which no resume reads."""
    for path in (Path(run_dir) / BATCH_DIR).glob("*"):
        name = path.name.removesuffix(".npz")  # a directory, or an earlier version's file
        if name.isdigit() and int(name) not in kept:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
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
