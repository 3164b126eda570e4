"""Rollout hosts at their own pace within the staleness bound (issue 28, Section 4.4, Eq. 4's
A): the loop hands batch t+s to the hosts before batch t is collected, with weights never older
than the bound; the ledger refuses a batch that is; an injected straggler slows one host per
step; under `da` a slowed rollout host does not hold the others back (a real Ray run)."""

import json
import time

import pytest

from locoexp.checkpoint.progress import TrainedBatch, ledger_row
from locoexp.compose import compose_config
from locoexp.dataset.schedule import PromptSchedule
from locoexp.errors import ConfigError
from locoexp.metrics.timing import StepTimer
from locoexp.placement.halves import HalfReport, Published, TrainResult, Window
from locoexp.placement.loop import StepLoop
from locoexp.placement.multihost import HostGroup
from locoexp.placement.ray.ledger import BatchLedger
from locoexp.placement.ray.terms import ScheduleTerms
from locoexp.placement.settings import LoopPlan
from locoexp.rollout.straggler import StragglerConfig, injected_delay_s, slowed_host


class Recording:
    """A transport that records what the loop asks, in order (no halves, no devices)."""

    group = HostGroup(index=0, count=1)

    def __init__(self):
        self.calls: list[tuple] = []

    def start_rollout(self, step, published):
        self.calls.append(("start", step, published.version))
        return step, published.version

    def collect_rollout(self, pending, timer):
        step, version = pending
        if timer is not None:
            self.calls.append(("collect", step))
        report = HalfReport({"rollout/reward_mean": 0.0}, Window(0.0, 1.0))
        return [report], [(step, version)]

    def start_train(self, step, batches, *, carried):
        return step, batches

    def collect_train(self, pending, timer):
        step, batches = pending
        metrics = {"train/loss": 0.0, "train/staleness_steps": step - batches[0][1]}
        return [
            TrainResult(
                step=step,
                published=Published(step + 1),
                example_ids=(),
                versions=(batches[0][1],),
                windows=(Window(0.0, 1.0),),
                exchanged=None,
                report=HalfReport(metrics, Window(1.0, 2.0)),
            )
        ]

    def exchange(self, record):
        return [record]

    def evaluate(self, published, *, limit):
        return 0.0


def plan(steps: int, staleness: int) -> LoopPlan:
    return LoopPlan(
        steps=steps,
        staleness=staleness,
        eval_every_steps=0,
        eval_at_updates=(),
        eval_limit=None,
        metrics_off_barrier=False,
        freeze_gc=False,
        eval_target=1.0,
        chips=1,
        chip_hour_price_usd=1.0,
    )


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_batches_start_up_to_the_bound_ahead_with_weights_never_older_than_it(staleness):
    transport, steps = Recording(), 6
    loop = StepLoop(transport, plan(steps, staleness), timer=StepTimer(), output=None, start_time=0)
    records = loop.run()
    starts = {
        step: version for kind, step, *v in transport.calls if kind == "start" for version in v
    }
    assert sorted(starts) == list(range(steps))  # every batch once
    for step, version in starts.items():
        assert step - staleness <= version <= step  # the bound, and never a future version
        # the newest weights allowed: those after update step - s (the initial ones at first)
        assert version == max(step - staleness, 0)
    order = [(kind, step) for kind, step, *_ in transport.calls]
    for step in range(steps - staleness):  # batch t+s is handed over before batch t is waited on
        assert order.index(("start", step + staleness)) < order.index(("collect", step))
    assert [r["train/staleness_steps"] for r in records] == [
        min(step, staleness) for step in range(steps)
    ]


def test_the_ray_transports_terms_are_eq4s_a_and_the_overlap_with_the_next_batch():
    def hosts(*windows):
        return [HalfReport({}, Window(*w)) for w in windows]

    def trained(start, end):
        report = HalfReport({}, Window(start, end))
        return [TrainResult(step=0, published=None, example_ids=(), versions=(0,), windows=(),
                            exchanged=None, report=report)]  # fmt: skip

    terms = ScheduleTerms()
    terms.reports[0] = hosts((0.0, 4.0), (0.0, 1.0))  # a host 3 s behind the other
    terms.reports[1] = hosts((4.0, 5.0), (1.0, 5.0))  # the fast one started batch 1 at once
    terms.trained[0] = trained(4.0, 6.0)
    first = terms.record_of(0)  # the attempt's first batch: nothing absorbed yet
    assert first == {
        "timing/straggler_absorbed_s": 0.0, "timing/overlap_s": 1.0, "timing/overlap_share": 0.5,
    }  # fmt: skip
    terms.trained[1] = trained(6.0, 7.0)
    # batch 1 was done 1 s after batch 0 though its slowest host took 4 s: 3 s absorbed
    assert terms.record_of(1) == {
        "timing/straggler_absorbed_s": 3.0, "timing/overlap_s": 0.0, "timing/overlap_share": 0.0,
    }  # fmt: skip
    assert set(terms.reports) == {1} and not terms.trained  # forgotten once no record needs them


def test_the_ledger_refuses_a_batch_staler_than_the_bound(tmp_path):
    schedule = PromptSchedule(8, 2, seed=0, batches_per_pass=None, passes=1)
    ledger = BatchLedger(schedule, list(range(8)), tmp_path / "b.jsonl", max_staleness=1)

    def result(step, version):
        ids = tuple(int(i) for i in schedule.batch(step))
        report = HalfReport({}, Window(0.0, 1.0))
        return TrainResult(
            step=step, published=None, example_ids=ids, versions=(version,),
            windows=(Window(0.0, 1.0),), exchanged=None, report=report,
        )  # fmt: skip

    ledger.record(result(2, 1))
    with pytest.raises(RuntimeError, match="placement.max_staleness=1"):
        ledger.record(result(3, 1))
    ledger.close()
    row = ledger_row(json.loads((tmp_path / "b.jsonl").read_text().splitlines()[0]))
    assert row == TrainedBatch(
        step=2, example_ids=row.example_ids, weight_versions=(1,), rollout_windows=((0.0, 1.0),)
    )


def test_an_injected_straggler_slows_one_host_per_step_the_same_on_every_host():
    config = StragglerConfig(delay_s=0.05, factor=2.0)
    for step in range(4):
        chosen = slowed_host(config, step=step, hosts=3, seed=7)
        assert chosen == slowed_host(config, step=step, hosts=3, seed=7)  # no host talks
        start = time.perf_counter()
        delays = [
            injected_delay_s(config, step=step, host=h, hosts=3, seed=7, generation_s=0.1)
            for h in range(3)
        ]
        assert delays == [pytest.approx(0.15) if h == chosen else 0.0 for h in range(3)]
        assert time.perf_counter() - start >= 0.15  # slept, not merely reported
    fixed = StragglerConfig(delay_s=0.0, factor=1.5, host=2)
    assert {slowed_host(fixed, step=s, hosts=3, seed=s) for s in range(5)} == {2}


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["placement.max_staleness=2"], "placement.max_staleness=2 is not read by this run"),
        (
            ["placement=da", "split=0.5", "hardware.hosts=2", "placement.max_staleness=0"],
            "placement.max_staleness=0",
        ),
        (["rollout.straggler.host=1"], r"rollout.straggler.host=1 is not one of the 1 rollout"),
        (["rollout.straggler.factor=0.5"], "rollout.straggler.factor=0.5 must be >= 1"),
    ],
)
def test_bad_staleness_and_straggler_settings_are_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        compose_config(overrides)


SLOW_HOST = [
    "placement=da",
    "hardware.hosts=3",
    "split=0.333",  # 1 trainer host, 2 rollout hosts
    "dataset.prompts_per_step=2",
    "dataset.samples_per_prompt=2",
    "dataset.synthetic.held_out_size=8",
    "steps=5",
    "eval_every_steps=0",
    "checkpoint_every_steps=0",
    "logger=none",
    "rollout.straggler.delay_s=3.0",  # one rollout host per step, drawn: 0, 1, 1, 0, 1
    "seed=1",
]


@pytest.mark.slow
def test_a_slowed_rollout_host_does_not_hold_the_other_back(tmp_path):
    from locoexp.main import run  # noqa: PLC0415
    from locoexp.metrics.run_records import read_metrics_jsonl  # noqa: PLC0415

    run(compose_config(SLOW_HOST), run_dir=tmp_path, progress=False)
    rows = [
        ledger_row(json.loads(x)) for x in (tmp_path / "batches.jsonl").read_text().splitlines()
    ]
    assert [r.step for r in rows] == list(range(5))
    assert all(r.step - min(r.weight_versions) <= 1 for r in rows)  # placement.max_staleness
    # a host started its share of batch t+1 while another still generated batch t (a synchronous
    # schedule hands batch t+1 out only once every share of batch t is in)
    windows = [r.rollout_windows for r in rows]
    ahead = [
        windows[t + 1][j][0] < windows[t][i][1]
        for t in range(4)
        for i in range(2)
        for j in range(2)
        if i != j
    ]
    assert any(ahead), windows
    records = [r for r in read_metrics_jsonl(tmp_path / "metrics.jsonl") if "train/loss" in r]
    straggler = StragglerConfig(delay_s=3.0)
    for row, record in zip(rows, records, strict=True):
        assert record["rollout/injected_delay_s_max"] == pytest.approx(3.0)
        shares = [end - start for start, end in row.rollout_windows]  # each host's, this batch
        slowed = slowed_host(straggler, step=row.step, hosts=2, seed=1)
        assert shares[slowed] >= 3.0  # the delay lands in the drawn host's share of this batch
        # The record's straggler is this batch's: its slowest host took the whole delay, and no
        # longer than the batch's longest share (a host's time is read before its window ends).
        # Its lead over the mean is positive but no promised figure: with two hosts it is half
        # their gap, (3 s + w_slowed - w_other) / 2, w being a host's own work on its share
        # (load, admission, generation, reward). At step 0, w is each engine's first compile,
        # ~12 s on both hosts at once, so the lead is 1.5 s minus half the difference of two
        # concurrent 12 s compiles. A run failed `straggler_s > 1.0` (issue 44): a lead under
        # 1 s needs w_other - w_slowed > 1 s, which only step 0's compiles make likely (the
        # other host's ending over 1 s after the slowed host's, on a loaded machine or with the
        # slowed host loading programs from the persistent compilation cache). After warm-up w
        # is ~10 ms and the lead ~1.5 s, but how long a host's work takes on a loaded machine is
        # no property of the schedule (Eq. 4's analysis reads the steady steps only).
        assert 3.0 <= record["timing/rollout_host_s"] <= max(shares)
        lead = record["timing/rollout_host_s"] - record["timing/rollout_host_s_mean"]
        assert record["timing/straggler_s"] == pytest.approx(lead) and lead > 0.0
    # Eq. 4's A: where the slowed host changes, the other one had started the next batch early
    assert max(r["timing/straggler_absorbed_s"] for r in records[1:]) > 0.0
