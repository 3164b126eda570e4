"""Cost-to-learn (Appendix I.1) on crafted checkpoint sequences."""

import pytest

from locoexp.metrics.cost import (
    Checkpoint,
    checkpoints_from_records,
    compute_cell_cost_to_learn,
    compute_cost_to_learn,
)

# Table I3's scored checkpoints (updates 275, 300, 325, 348), 10 s of wall time per update.
STEPS = (275, 300, 325, 348)


def make_checkpoints(scores, *, seconds_per_step=10.0):
    return [
        Checkpoint(step=s, elapsed_s=s * seconds_per_step, score=x)
        for s, x in zip(STEPS, scores, strict=True)
    ]


def charge(scores, *, price=0.0):
    return compute_cost_to_learn(
        make_checkpoints(scores), target=0.85, chips=8, chip_hour_price_usd=price
    )


def test_cleared_once_then_missed_is_not_charged_there():
    cost = charge([0.86, 0.84, 0.86, 0.87])
    assert cost.reached and cost.charged_step == 325


def test_cleared_twice_is_charged_at_the_first_of_the_two():
    cost = charge([0.80, 0.85, 0.90, 0.70])
    assert cost.reached and cost.charged_step == 300
    assert cost.elapsed_s == 3000.0
    assert cost.chip_hours == pytest.approx(8 * 3000.0 / 3600.0)


def test_never_cleared_is_not_reached():
    cost = charge([0.5, 0.6, 0.7, 0.84999])
    assert not cost.reached
    assert cost.as_metrics() == {
        "cost/target": 0.85,
        "cost/reached": False,
        "cost/status": "not reached",
    }


def test_cleared_at_the_last_checkpoint_only_is_not_reached():
    assert not charge([0.5, 0.6, 0.7, 0.95]).reached


def test_money_is_chip_hours_times_price_and_absent_when_unpriced():
    priced = charge([0.9, 0.9, 0.9, 0.9], price=2.5)
    assert priced.charged_step == 275
    assert priced.usd == pytest.approx(priced.chip_hours * 2.5)
    assert priced.as_metrics()["cost/usd"] == pytest.approx(priced.usd)
    assert charge([0.9, 0.9, 0.9, 0.9]).usd is None


def test_a_cell_pools_seed_scores_and_sums_seed_chip_hours():
    # Seed means: 0.84, 0.86, 0.86, 0.80 -> charged at 300 though seed 0 alone clears at 275.
    seeds = [
        make_checkpoints([0.88, 0.86, 0.90, 0.80]),
        make_checkpoints([0.80, 0.86, 0.82, 0.80], seconds_per_step=20.0),
    ]
    cost = compute_cell_cost_to_learn(seeds, target=0.85, chips=4, chip_hour_price_usd=0.0)
    assert cost.charged_step == 300
    assert cost.chip_hours == pytest.approx(4 * (3000.0 + 6000.0) / 3600.0)


def test_checkpoints_out_of_order_are_rejected():
    bad = [
        Checkpoint(step=300, elapsed_s=1.0, score=0.9),
        Checkpoint(step=275, elapsed_s=2.0, score=0.9),
    ]
    with pytest.raises(ValueError, match="rise in step"):
        compute_cost_to_learn(bad, target=0.5, chips=1, chip_hour_price_usd=0.0)


def test_checkpoints_from_records_take_elapsed_time_from_the_scored_step():
    records = [
        {"step": 0, "time/elapsed_s": 5.0},
        {"step": 1, "time/elapsed_s": 9.0},
        {"step": 1, "eval/accuracy": 0.5, "eval/seconds": 3.0},
        {"step": 2, "time/elapsed_s": 13.0},
        {"step": 2, "eval/accuracy": 0.75, "time/elapsed_s": 13.5},
    ]
    assert checkpoints_from_records(records) == [
        Checkpoint(step=1, elapsed_s=9.0, score=0.5),
        Checkpoint(step=2, elapsed_s=13.5, score=0.75),
    ]
