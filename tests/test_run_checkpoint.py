"""Training-state checkpoints (orbax): round trips, resume rules, and 2-host save/restore with
real processes joined by jax.distributed."""

import numpy as np
import pytest
from support import survive

from locoexp.checkpoint.config import ResumeMode
from locoexp.checkpoint.progress import RolloutRestart, RunProgress, TrainedBatch, config_digest
from locoexp.checkpoint.state import (
    RunCheckpoints,
    check_same_config,
    resume_step,
)
from locoexp.errors import ConfigError
from locoexp.metrics.cost import Checkpoint
from locoexp.placement.launch import launch_local_processes


def _load(path):
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _progress(step: int, **extra) -> RunProgress:
    return RunProgress(next_step=step, seed=3, elapsed_s=2.0 * step, eval_total_s=0.5, **extra)


def test_progress_and_arrays_round_trip_and_latest_is_the_newest(tmp_path):
    import jax.numpy as jnp

    arrays = {"w": jnp.arange(6.0).reshape(2, 3), "count": jnp.int32(7)}
    scored = (Checkpoint(step=4, elapsed_s=9.0, score=0.5),)
    ledger = (
        TrainedBatch(step=0, example_ids=(1, 2), weight_versions=(0,)),
        RolloutRestart(host=1, step=1, regenerated="batch", weight_version=0),
    )
    checkpoints = RunCheckpoints(tmp_path)
    checkpoints.save(_progress(5, scored=scored, ledger=ledger, weight_version=4), arrays)
    checkpoints.save(_progress(9), {"w": arrays["w"] * 2, "count": jnp.int32(8)}, wait=True)
    assert checkpoints.latest_step() == 9
    progress, restored = checkpoints.restore(5, arrays)
    np.testing.assert_array_equal(restored["w"], arrays["w"])
    assert int(restored["count"]) == 7
    assert progress == _progress(5, scored=scored, ledger=ledger, weight_version=4)
    checkpoints.close()
    assert RunCheckpoints(tmp_path).read_progress(9).next_step == 9


def test_max_to_keep_removes_older_checkpoints(tmp_path):
    import jax.numpy as jnp

    checkpoints = RunCheckpoints(tmp_path, max_to_keep=2)
    for step in (1, 2, 3):
        checkpoints.save(_progress(step), {"w": jnp.ones(3) * step}, wait=True)
    checkpoints.close()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [
        "2",
        "3",
    ]


def test_resume_modes(tmp_path):
    import jax.numpy as jnp

    empty = RunCheckpoints(tmp_path / "a")
    assert resume_step(ResumeMode.auto, empty.latest_step(), empty.directory) is None
    assert resume_step(ResumeMode.never, empty.latest_step(), empty.directory) is None
    with pytest.raises(ConfigError, match="resume=must"):
        resume_step(ResumeMode.must, empty.latest_step(), empty.directory)
    full = RunCheckpoints(tmp_path / "b")
    full.save(_progress(4), {"w": jnp.ones(2)}, wait=True)
    assert resume_step(ResumeMode.auto, full.latest_step(), full.directory) == 4
    assert resume_step(ResumeMode.must, full.latest_step(), full.directory) == 4
    with pytest.raises(ConfigError, match="resume=never"):
        resume_step(ResumeMode.never, full.latest_step(), full.directory)


def test_a_checkpoint_of_another_config_is_refused_naming_the_keys(tmp_path):
    run = {"seed": 0, "steps": 10, "algo": {"learning_rate": 1e-3}, "logger": {"kind": "none"}}
    digest = config_digest(run)
    longer = {**run, "steps": 20, "logger": {"kind": "wandb"}}
    check_same_config(_progress(1, config_digest=digest), config_digest(longer), tmp_path)
    other = {**run, "algo": {"learning_rate": 1e-2}}
    with pytest.raises(ConfigError, match=r"different settings \(algo.learning_rate\)"):
        check_same_config(_progress(1, config_digest=digest), config_digest(other), tmp_path)


@pytest.mark.slow
def test_two_hosts_each_write_their_shards_and_a_restore_continues_exactly(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    args = (str(out), str(run_dir))
    assert (
        launch_local_processes(
            survive.train_save_continue, args, num_processes=2, devices_per_process=1
        )
        == 0
    )
    step_dir = run_dir / "checkpoints" / "1" / "arrays"
    assert {p.name for p in step_dir.glob("ocdbt.process_*")} == {
        "ocdbt.process_0",
        "ocdbt.process_1",
    }
    assert (
        launch_local_processes(
            survive.restore_continue, args, num_processes=2, devices_per_process=1
        )
        == 0
    )
    for host in range(2):
        before, after = _load(out / f"uninterrupted_{host}.npz"), _load(out / f"resumed_{host}.npz")
        assert before.keys() == after.keys()
        for name in before:
            np.testing.assert_array_equal(after[name], before[name], err_msg=name)
