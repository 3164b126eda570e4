"""`placement=da` with real Ray actors and real processes on CPU (tiny model, synthetic task):
one-step staleness, importance weights, every batch trained exactly once, per-side timings,
and no process left behind after a run. Lost hosts, checkpoints and resume: test_da_survival.py."""

import contextlib
import json
import os
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import psutil
import pytest

from locoexp.algo.grpo import per_token_loss
from locoexp.compose import compose_config
from locoexp.dataset.build import build_task
from locoexp.dataset.schedule import build_schedule
from locoexp.errors import ConfigError
from locoexp.main import run as run_grpo
from locoexp.metrics.run_records import read_metrics_jsonl

pytestmark = pytest.mark.slow
CONF = Path(__file__).resolve().parents[1] / "conf"

TINY = ["logger=none", "eval_every_steps=0", "dataset.synthetic.held_out_size=8", "placement=da"]
# The 2-host split=0.5 layout runs in test_step_loop (its records against the pre-refactor
# run) and test_da_survival (stopped, killed, resumed; its sockets); here the layout with 3
# rollout hosts of uneven shares.
RUNS = {
    "4 hosts, split=0.25": [
        "split=0.25",
        "hardware.hosts=4",
        "dataset.prompts_per_step=6",
        "profile_steps=[2]",  # PROFILED: each actor traces its own side of step 2
    ],
}
STEPS, PROFILED = 4, 2
SHARES = ("compute", "network", "host")
TIMING_KEYS = [
    f"timing/{name}_s"
    for name in (
        "load", "admission", "generation", "reward", "rollout",  # rollout side, batch t
        "transfer", "pack", "train", "publish", "trainer",  # trainer side, step t
        "step", "trainer_idle", "overlap",  # the driver's period and what overlapped
        "rollout_compile", "trainer_compile", "compile",  # each side's compile events, the driver's
    )
]  # fmt: skip


# Ray's daemons and workers inherit this from the test process: they are this test's, not those
# of another run sharing the machine (tests look only at what they started)
os.environ["LOCOEXP_TEST_OWNER"] = str(os.getpid())


def started_here(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return process.environ().get("LOCOEXP_TEST_OWNER") == str(os.getpid())
    return False


def ray_processes() -> set[int]:
    """This test's Ray processes: actor workers (`ray::...`) and the cluster daemons."""
    found = set()
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        is_ray = cmdline.startswith("ray::") or process.info["name"] in ("raylet", "gcs_server")
        if is_ray and started_here(process):
            found.add(process.info["pid"])
    return found


def assert_no_new_ray_processes(before: set[int], *, wait_s: float = 20.0) -> None:
    deadline = time.monotonic() + wait_s
    while (left := ray_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, [psutil.Process(p).cmdline() for p in left if psutil.pid_exists(p)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each layout once: (config, run directory, summary, Ray processes left after it)."""
    out = {}
    for name, overrides in RUNS.items():
        config = _compose([*TINY, *overrides, f"steps={STEPS}", "dataset.samples_per_prompt=2"])
        run_dir = tmp_path_factory.mktemp("da")
        before = ray_processes()
        summary = run_grpo(config, run_dir=run_dir, progress=False)
        assert_no_new_ray_processes(before)
        out[name] = (config, run_dir, summary)
    return out


def _compose(overrides):
    return compose_config(list(overrides))


def _steps(run_dir):
    return [r for r in read_metrics_jsonl(run_dir / "metrics.jsonl") if "eval/accuracy" not in r]


@pytest.mark.parametrize("layout", RUNS)
def test_da_runs_every_step_and_writes_the_co_records(runs, layout):
    _, run_dir, summary = runs[layout]
    records = _steps(run_dir)
    assert [r["step"] for r in records] == list(range(STEPS))
    for record in records:
        assert set(TIMING_KEYS) <= record.keys(), set(TIMING_KEYS) - record.keys()
        assert record["rollout/tokens_out"] > 0 and np.isfinite(record["train/loss"])
        assert 0.0 <= record["timing/overlap_share"] <= 1.0
    # the actors compile their programs in their first calls, each side under its own key
    assert records[0]["timing/rollout_compile_s"] > 0 and records[0]["timing/trainer_compile_s"] > 0
    evals = [r for r in read_metrics_jsonl(run_dir / "metrics.jsonl") if "eval/accuracy" in r]
    assert [e["step"] for e in evals] == [STEPS - 1]
    written = json.loads((run_dir / "summary.json").read_text())
    assert written["steps"] == summary["steps"] == STEPS
    assert written["eval_accuracy"] == evals[0]["eval/accuracy"]


@pytest.mark.parametrize("layout", RUNS)
def test_staleness_is_exactly_one_step_after_warm_up(runs, layout):
    _, run_dir, _ = runs[layout]
    records = _steps(run_dir)
    assert [r["train/staleness_steps"] for r in records] == [0] + [1] * (STEPS - 1)
    # batch t (t >= 1) was generated with the weights published after step t-2 (version t-1)
    assert [r["rollout/weight_version"] for r in records] == [0, *range(STEPS - 1)]


@pytest.mark.parametrize("layout", RUNS)
def test_importance_weight_is_one_where_sampler_and_trainer_weights_agree(runs, layout):
    step0 = _steps(runs[layout][1])[0]  # both sides hold the initial weights
    assert step0["train/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert step0["train/sampler_logprob_gap"] < 1e-4


@pytest.mark.parametrize("layout", RUNS)
def test_a_profiled_step_splits_each_sides_time_three_ways(runs, layout):
    """Every trainer and rollout actor traces its own call of the profiled step (the rollout
    hosts batch t's generation, the trainer hosts step t) into `profile/step<t>/<side><i>/`;
    the step's record carries each side's Table H1 split, whose shares sum to 1 and whose
    network share holds the Ray object-store exchanges (batches fetched, weights fetched)."""
    config, run_dir, _ = runs[layout]
    layout_hosts = {"trainer": 1, "rollout": config.hardware.hosts - 1}  # split=0.25 of 4
    traced = run_dir / "profile" / f"step{PROFILED}"
    assert sorted(p.name for p in traced.iterdir()) == sorted(
        f"{side}{i}" for side, count in layout_hosts.items() for i in range(count)
    )
    for host in traced.iterdir():
        assert list(host.glob("plugins/profile/*/*.xplane.pb")), host
    records = _steps(run_dir)
    assert [r["step"] for r in records if "breakdown/trainer_step_s" in r] == [PROFILED]
    assert "breakdown/compute_share" not in records[PROFILED]  # the driver has no devices
    for side in layout_hosts:
        parts = [records[PROFILED][f"breakdown/{side}_{k}_share"] for k in SHARES]
        assert sum(parts) == pytest.approx(1.0) and all(0 <= x <= 1 for x in parts), (side, parts)
        assert parts[0] > 0 and parts[1] > 0, (side, parts)  # devices ran; Ray exchanged
        assert records[PROFILED][f"breakdown/{side}_profile_s"] > 0


def test_importance_weight_of_equal_log_probs_is_exactly_one():
    logp = jnp.array([-0.5, -2.0, -7.0])
    _, terms = per_token_loss(
        logp, logp, jnp.ones(3), clip_eps_low=0.2, clip_eps_high=0.2,
        behaviour_logp=logp, tis_cap=2.0,
    )  # fmt: skip
    np.testing.assert_array_equal(terms["train/tis_weight_mean"], np.ones(3))
    _, stale = per_token_loss(
        logp, logp, jnp.ones(3), clip_eps_low=0.2, clip_eps_high=0.2,
        behaviour_logp=logp - 5.0, tis_cap=2.0,
    )  # fmt: skip
    np.testing.assert_array_equal(stale["train/tis_weight_mean"], np.full(3, 2.0))  # capped


@pytest.mark.parametrize("layout", RUNS)
def test_every_batch_is_trained_once_with_the_scheduled_prompts(runs, layout):
    config, run_dir, _ = runs[layout]
    task = build_task(config.dataset, tokenizer_dir=config.model.checkpoint)
    schedule = build_schedule(config.dataset, steps=config.steps, num_examples=len(task.train))
    lines = [json.loads(x) for x in (run_dir / "batches.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(STEPS))
    for line in lines:
        scheduled = [task.train[i].id for i in schedule.batch(line["step"])]
        assert sorted(line["example_ids"]) == sorted(scheduled)
        assert len(line["example_ids"]) == len(set(line["example_ids"]))


def test_rollout_hosts_take_uneven_shares_of_whole_groups_but_not_none():
    # 4 prompts over 3 rollout hosts: 2, 1, 1 groups (the paper's 0.25 split, Table F1)
    config = _compose([*TINY, "split=0.25", "hardware.hosts=4", "dataset.prompts_per_step=4"])
    assert config.split == 0.25
    with pytest.raises(ConfigError, match="some of the 3 rollout hosts of placement=da no GRPO"):
        _compose([*TINY, "split=0.25", "hardware.hosts=4", "dataset.prompts_per_step=2"])


def test_o1_is_refused_under_da_and_turned_off_by_its_placement_file():
    assert not _compose([*TINY, "split=0.5", "hardware.hosts=2"]).opt.metrics_off_barrier
    with pytest.raises(ConfigError, match="opt.metrics_off_barrier=true"):
        _compose([*TINY, "split=0.5", "hardware.hosts=2", "opt.metrics_off_barrier=true"])
