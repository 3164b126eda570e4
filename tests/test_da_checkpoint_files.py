"""What a `placement=da` checkpoint adds beside the trainer's shards, without Ray: every batch in
flight comes back bit for bit with its weight version (an earlier version's single next batch
too), the batches of checkpoints no longer kept are pruned, and the batch ledger of a resumed run
is the checkpoint's (rewritten, restarts counted), refusing a batch trained twice."""

import json

import numpy as np
import pytest

from locoexp.compose import compose_config
from locoexp.dataset.schedule import PromptSchedule
from locoexp.errors import ConfigError
from locoexp.placement.halves import HalfReport, RolloutBatch, TrainResult, Window
from locoexp.placement.ray.ledger import BatchLedger
from locoexp.placement.ray.saved_batches import (
    BATCH_DIR,
    batch_path,
    clear_batches,
    load_batches,
    prune_batches,
    save_batches,
)


def _batch(step: int, host: int, *, staleness: int = 1) -> RolloutBatch:
    rng = np.random.default_rng(10 * step + host)
    lengths = rng.integers(1, 9, size=4)
    return RolloutBatch(
        step=step,
        weight_version=max(step - staleness, 0),
        example_ids=(2 * host, 2 * host + 1),
        prompts=tuple(rng.integers(0, 100, size=5).astype(np.int32) for _ in lengths),
        completions=tuple(rng.integers(0, 100, size=n).astype(np.int32) for n in lengths),
        behaviour_logprobs=tuple(-rng.random(n).astype(np.float32) for n in lengths),
        advantages=rng.standard_normal(4).astype(np.float32),
        report=HalfReport({"rollout/reward_mean": 0.1 * host}, Window(1.5, 2.25)),
    )


def _assert_same(got: RolloutBatch, want: RolloutBatch) -> None:
    assert (got.step, got.weight_version, got.example_ids, got.report) == (
        want.step,
        want.weight_version,
        want.example_ids,
        want.report,
    )
    for name in ("prompts", "completions", "behaviour_logprobs"):
        for a, b in zip(getattr(got, name), getattr(want, name), strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got.advantages, want.advantages)


def test_every_batch_in_flight_comes_back_exactly_with_its_weight_version(tmp_path):
    # staleness 3, the checkpoint after 3 updates: batches 3, 4, 5 sampled with the weights
    # after updates 0, 1, 2, none of which the checkpoint holds
    saved = {
        step: [_batch(step, 0, staleness=3), _batch(step, 1, staleness=3)] for step in (3, 4, 5)
    }
    for step, batches in saved.items():
        save_batches(tmp_path, 3, step, batches)
    save_batches(tmp_path, 4, 4, [_batch(4, 0, staleness=3)])  # the next checkpoint's, apart
    loaded = load_batches(tmp_path, 3)
    assert load_batches(tmp_path, 6) == {}
    assert sorted(loaded) == [3, 4, 5]
    assert [b.weight_version for b in loaded[5]] == [2, 2]
    for step, batches in saved.items():
        for got, want in zip(loaded[step], batches, strict=True):
            _assert_same(got, want)


def test_an_earlier_versions_next_batch_is_read_as_its_checkpoints(tmp_path):
    # before issue 44 a checkpoint after k updates kept batch k alone, as da_batches/<k>.npz
    save_batches(tmp_path, 3, 3, [_batch(3, 0)])
    (tmp_path / BATCH_DIR / "3" / "3.npz").rename(tmp_path / BATCH_DIR / "3.npz")
    (tmp_path / BATCH_DIR / "3").rmdir()
    loaded = load_batches(tmp_path, 3)
    assert list(loaded) == [3]
    _assert_same(loaded[3][0], _batch(3, 0))
    prune_batches(tmp_path, kept={6})
    assert not list((tmp_path / BATCH_DIR).iterdir())


def test_batches_of_no_kept_checkpoint_are_removed(tmp_path):
    # 3: its checkpoint deleted since; 12: a checkpoint never completed (killed mid-save)
    for checkpoint in (3, 6, 9, 12):
        for step in (checkpoint, checkpoint + 1):
            save_batches(tmp_path, checkpoint, step, [_batch(step, 0)])
    prune_batches(tmp_path, kept={6, 9})
    assert sorted(p.name for p in (tmp_path / BATCH_DIR).iterdir()) == ["6", "9"]
    assert sorted(load_batches(tmp_path, 9)) == [9, 10]


def test_a_checkpoint_written_again_holds_only_what_it_saves(tmp_path):
    # an attempt killed before its checkpoint after 6 updates was complete left batches 6 and 7;
    # the resumed run writes that checkpoint again and, with fewer steps left, saves batch 6 only
    for step in (6, 7):
        save_batches(tmp_path, 6, step, [_batch(step, 0)])
    clear_batches(tmp_path, 6)
    save_batches(tmp_path, 6, 6, [_batch(6, 0)])
    assert list(load_batches(tmp_path, 6)) == [6]


def _result(step: int, schedule: PromptSchedule) -> TrainResult:
    return TrainResult(
        step=step,
        published=None,
        example_ids=tuple(int(i) for i in schedule.batch(step)),
        versions=(step,),
        windows=(Window(0.0, 1.0),),
        exchanged=None,
        report=HalfReport({}, Window(0.0, 1.0)),
    )


def test_a_resumed_ledger_is_the_checkpoints_and_counts_its_restarts(tmp_path):
    schedule = PromptSchedule(16, 4, seed=0, batches_per_pass=None, passes=1)
    ids, path = list(range(16)), tmp_path / "batches.jsonl"
    first = BatchLedger(schedule, ids, path)
    first.record(_result(0, schedule))
    first.record_restart(host=1, step=1, regenerated="batch 1", weight_version=0)
    first.record(_result(1, schedule))
    kept = list(first.rows)
    first.record(_result(2, schedule))  # after the checkpoint: lost with the attempt
    first.close()
    resumed = BatchLedger(schedule, ids, path, rows=kept)
    assert (resumed.trained, resumed.restarts(), resumed.restarts(0)) == ([0, 1], 1, 0)
    with pytest.raises(RuntimeError, match="exactly once"):
        resumed.record(_result(1, schedule))
    resumed.record(_result(2, schedule))
    resumed.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows if "example_ids" in r] == [0, 1, 2]
    assert [r["event"] for r in rows if "event" in r] == ["rollout_restart"]


def test_a_negative_restart_budget_is_refused():
    base = ["placement=da", "split=0.5", "hardware.hosts=2", "dataset.prompts_per_step=4"]
    assert compose_config(base).placement.rollout_restarts == 3
    with pytest.raises(ConfigError, match="placement.rollout_restarts=-1"):
        compose_config([*base, "placement.rollout_restarts=-1"])


def test_a_batch_that_cannot_be_written_is_one_sentence_and_leaves_no_file(tmp_path):
    partial = batch_path(tmp_path, 3, 3).with_suffix(".partial.npz")
    partial.parent.mkdir(parents=True)
    partial.symlink_to("/dev/full")  # every write to it fails as on a full disk (ENOSPC)
    with pytest.raises(ConfigError) as refused:
        save_batches(tmp_path, 3, 3, [_batch(3, 0)])
    message = str(refused.value)
    assert message.startswith(f"batch 3 of the next checkpoint could not be written to {tmp_path}")
    assert "(No space left on device)" in message and "\n" not in message
    assert not list(partial.parent.iterdir())  # neither the partial nor the batch file
