"""Training-state checkpoints of one run, with orbax's `CheckpointManager`.

A checkpoint at step k is everything a run needs to continue with step k as if it had never
stopped: the sharded arrays (policy parameters, AdamW state, the KL reference when there is one)
and `progress.RunProgress`, a small JSON record of the host-side state (the next step, which is
also the prompt schedule's position, the seed every PRNG key derives from, the cost-to-learn
clock and scored checkpoints, and under `placement=da` the published weight version and the
batch ledger).

Multi-host: every process calls `save` and `restore` with its own global arrays; orbax writes and
reads each process's addressable shards and process 0 writes the JSON. Saves are asynchronous:
`save` returns once the arrays are copied off the devices, the files are written in the
background, and a checkpoint becomes visible (`latest_step`) only once complete, so a process
killed mid-save leaves the previous checkpoint in place. A save that cannot fit on the disk is
refused before it starts, and one that fails in the background is reported at the step loop's
next `check` (each step) or the next `save`, whichever comes first; either is one sentence
(`ConfigError`) saying how much space the run's checkpoints need, with the partial files removed
and the last complete checkpoint intact.

This module must not decide when to save or what a resumed run does with its records; the step
loop does.
"""

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from locoexp.checkpoint.config import ResumeMode
from locoexp.checkpoint.progress import RunProgress
from locoexp.errors import ConfigError

CHECKPOINT_DIR = "checkpoints"  # under the run directory
KEPT_CHECKPOINTS = 2  # orbax's max_to_keep: the newest two survive; a third is written before


def abstract_like(tree: Any) -> Any:
    """Shapes, dtypes and shardings of live arrays: what a restore fills in."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class RunCheckpoints:
    """The checkpoints under `<run_dir>/checkpoints`, one orbax step directory per saved step."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        max_to_keep: int = KEPT_CHECKPOINTS,
        async_save: bool = True,
    ):
        self.directory = Path(run_dir).resolve() / CHECKPOINT_DIR
        # orbax reports every save phase at INFO through absl, which Hydra's root logger prints
        logging.getLogger("absl").setLevel(logging.WARNING)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("arrays", "progress")
        )
        self.max_to_keep = max_to_keep
        self._saving: tuple[int, int] | None = None  # (step, bytes) of the save in flight
        self._failed = False

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step (= its `next_step`), or None."""
        return self._manager.latest_step()

    def save(self, progress: RunProgress, arrays: Any, *, wait: bool = False) -> None:
        """Checkpoint `arrays` (any pytree of global arrays) and `progress` at progress.next_step.
        Every process must call it; with `wait` it returns once the files are on disk."""
        # orbax's save waits for the save before it anyway; waiting here first reports that
        # save's own failure as its sentence (orbax's would raise it raw)
        self.wait()
        step, need = progress.next_step, local_bytes(arrays)
        free = shutil.disk_usage(self.directory).free
        if need > free:
            self._saving = (step, need)
            raise self._refusal(f"{_mib(free)} MiB free")
        args = ocp.args.Composite(
            arrays=ocp.args.StandardSave(arrays), progress=ocp.args.JsonSave(progress.to_json())
        )
        self._saving = (step, need)
        self._manager.save(step, args=args, force=True)
        if wait:
            self.wait()

    def check(self) -> None:
        """Raise `ConfigError` (one sentence) if a background save has failed."""
        try:
            self._manager.check_for_errors()
        except Exception as error:  # noqa: BLE001  (whatever failed the write, one sentence)
            raise self._refusal(str(error).splitlines()[0][:160]) from None

    def _refusal(self, reason: str) -> ConfigError:
        """The sentence for a checkpoint that could not be written; its partial files removed."""
        self._failed = True
        assert self._saving is not None, "a refusal is of the save in flight"
        step, need = self._saving
        if jax.process_index() == 0:
            for partial in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
                shutil.rmtree(partial, ignore_errors=True)
        last = latest_saved_step(self.directory.parent)
        kept = "no earlier checkpoint" if last is None else f"the checkpoint after step {last}"
        return ConfigError(
            f"the checkpoint after step {step} could not be written to {self.directory} "
            f"({reason}): each checkpoint of this run needs {_mib(need)} MiB and the run keeps "
            f"{self.max_to_keep}, so give it {_mib(need * (self.max_to_keep + 1))} MiB (the "
            f"newest is written before the oldest is deleted); {kept} is intact: free space or "
            "move the run directory, then rerun the same command to resume."
        )

    def restore(self, step: int, like: Any) -> tuple[RunProgress, Any]:
        """The checkpoint at `step`, its arrays placed like the live arrays `like`."""
        args = ocp.args.Composite(
            arrays=ocp.args.StandardRestore(abstract_like(like)),
            progress=ocp.args.JsonRestore(),
        )
        restored = self._manager.restore(step, args=args)
        return RunProgress.from_json(restored.progress), restored.arrays

    def read_progress(self, step: int) -> RunProgress:
        """Only the JSON part of the checkpoint at `step` (no arrays are read)."""
        restored = self._manager.restore(
            step, args=ocp.args.Composite(progress=ocp.args.JsonRestore())
        )
        return RunProgress.from_json(restored.progress)

    def wait(self) -> None:
        try:
            self._manager.wait_until_finished()
        except Exception as error:  # noqa: BLE001  (whatever failed the write, one sentence)
            raise self._refusal(str(error).splitlines()[0][:160]) from None

    def close(self) -> None:
        if self._failed:  # reported already; orbax would raise the same failure again
            return
        self.wait()
        self._manager.close()


def local_bytes(arrays: Any) -> int:
    """Bytes this process writes for `arrays`: its addressable shards, one replica each (a
    leaf that is not a jax.Array, e.g. a NumPy scalar, whole)."""
    total = 0
    for x in jax.tree.leaves(arrays):
        shards = getattr(x, "addressable_shards", None)
        if shards is None:
            total += np.asarray(x).nbytes
        else:
            total += sum(s.data.nbytes for s in shards if s.replica_id == 0)
    return total


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f}"


def resume_step(mode: ResumeMode, latest: int | None, directory: Path) -> int | None:
    """The step to resume from under `resume=mode`, or None to start at step 0, given the newest
    complete checkpoint `latest` in `directory` (`RunCheckpoints.latest_step`, or before the run
    starts `latest_saved_step`)."""
    match mode:
        case ResumeMode.auto:
            return latest
        case ResumeMode.never:
            if latest is not None:
                raise ConfigError(
                    f"resume=never but {directory} holds a checkpoint at step "
                    f"{latest}; use a new hydra.run.dir, delete it, or set resume=auto."
                )
            return None
        case ResumeMode.must:
            if latest is None:
                raise ConfigError(
                    f"resume=must but {directory} holds no checkpoint; point "
                    "hydra.run.dir at the run to resume or set resume=auto."
                )
            return latest


def check_same_config(progress: RunProgress, digest: str, directory: Path) -> None:
    """Refuse to resume a checkpoint written under a different config, naming the keys."""
    if progress.config_digest == digest:
        return
    before, now = json.loads(progress.config_digest or "{}"), json.loads(digest)
    keys = sorted(_differing_keys(before, now, prefix=""))
    raise ConfigError(
        f"{directory} holds a checkpoint of a run with different settings ({', '.join(keys)}); "
        "resume with the same config, or start this one in a new hydra.run.dir."
    )


def _differing_keys(a: Any, b: Any, *, prefix: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in set(a) | set(b):
            out += _differing_keys(a.get(key), b.get(key), prefix=f"{prefix}{key}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


def latest_saved_step(run_dir: str | Path) -> int | None:
    """The newest complete checkpoint's step, from the directory names alone (no jax, no orbax
    manager: the launcher's parent process uses it). Orbax renames a step directory to its bare
    number only once it is complete."""
    directory = Path(run_dir) / CHECKPOINT_DIR
    steps = [int(p.name) for p in directory.glob("*") if p.name.isdigit() and p.is_dir()]
    return max(steps, default=None)


def saved_progress(run_dir: str | Path, step: int) -> RunProgress:
    """The `RunProgress` of the complete checkpoint at `step`, read from its JSON file alone (no
    orbax manager, no jax: `locoexp.preflight` reads it before the run directory is touched).
    `ocp.args.JsonSave` writes the item as `<step>/progress/metadata`."""
    path = Path(run_dir) / CHECKPOINT_DIR / str(step) / "progress" / "metadata"
    return RunProgress.from_json(json.loads(path.read_text()))
