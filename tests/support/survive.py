"""Programs that tests run in real local host processes to check checkpoints and export.

Each runs in every process of a `jax.distributed` group (`launch_local_processes`) with the
platform's own Trainer, orbax checkpoints and export, and writes what the test compares to
`out_dir` (process p writes `<name>_<p>.npz`).
"""

from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from locoexp.algo.config import AlgoConfig
from locoexp.checkpoint.progress import RunProgress
from locoexp.checkpoint.state import RunCheckpoints
from locoexp.model.transformer import build_model
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.packing import pack_sequences
from locoexp.trainer.trainer import Trainer
from support.multihost import MAX_NEW, MODEL, SEQUENCES, agree, fixed_sequences


def _trainer() -> Trainer:
    return Trainer(
        build_model(MODEL, seed=0),
        AlgoConfig(learning_rate=1e-2),
        TrainerConfig(),
        mesh=Mesh(np.array(jax.devices()), ("fsdp",)),
        temperature=1.0,
        max_new_tokens=MAX_NEW,
    )


def _batch(seed: int):
    hosts, index = jax.process_count(), jax.process_index()
    prompts, completions, behaviour, advantages = fixed_sequences(seed)
    share = slice(index * SEQUENCES // hosts, (index + 1) * SEQUENCES // hosts)
    return pack_sequences(
        prompts[share],
        completions[share],
        behaviour[share],
        advantages[share],
        row_tokens=16,
        rows_multiple=len(jax.local_devices()),
        agree_rows=agree,
        loss_slots=SEQUENCES // hosts * MAX_NEW,
    )


def _write(out_dir: str, name: str, loss: float, trainer: Trainer) -> None:
    from locoexp.checkpoint.export import gather_to_host

    leaves = jax.tree_util.tree_flatten_with_path(gather_to_host(trainer.params))[0]
    arrays = {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}
    np.savez(Path(out_dir) / f"{name}_{jax.process_index()}.npz", loss=loss, **arrays)


def train_save_continue(out_dir: str, run_dir: str) -> None:
    """Step 0, an asynchronous checkpoint, then step 1 (which donates the saved buffers)."""
    trainer = _trainer()
    trainer.train_step(_batch(0))
    checkpoints = RunCheckpoints(run_dir)
    progress = RunProgress(next_step=1, seed=0, elapsed_s=1.5, eval_total_s=0.0)
    checkpoints.save(progress, trainer.state())
    loss = trainer.train_step(_batch(1))["train/loss"]
    checkpoints.close()
    _write(out_dir, "uninterrupted", loss, trainer)


def restore_continue(out_dir: str, run_dir: str) -> None:
    """A fresh trainer restored from the latest checkpoint, then step 1."""
    trainer = _trainer()
    checkpoints = RunCheckpoints(run_dir)
    progress, state = checkpoints.restore(checkpoints.latest_step(), trainer.state())
    trainer.load_state(state, steps_done=progress.next_step)
    loss = trainer.train_step(_batch(progress.next_step))["train/loss"]
    checkpoints.close()
    _write(out_dir, "resumed", loss, trainer)
