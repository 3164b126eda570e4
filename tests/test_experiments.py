"""Every experiment file of experiments/experiment/ composes, cell by cell of its Hydra sweep,
into the typed Config; every paper-scale experiment dry-runs (prints its plan, exit 0)."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from locoexp.compose import sweep_jobs
from locoexp.config import Config
from locoexp.planner import resolve_plan
from locoexp.planner.paper import PAPER_EXPERIMENTS
from locoexp.session.build import plan_setup

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "experiments" / "experiment").glob("*.yaml"))
# The paper's experiments (each with a `_cpu` variant); other files hold benchmark workloads.
PAPER_SCALE = [
    "co_vs_da",
    "cost_to_learn",
    "cost_to_learn_seeds",
    "cost_to_learn_frozen",
    "lever_ablation",
    "maxtext_gemma4_recipe",
    "model_size",
    "pathways_ratio",
    "scale_controls",
    "scale_study",
    "stack_comparison",
    "tp_sweep_64",
    "tunix_recipe",
]
REPEATS = ("launch", "seed")  # repeat a cell; composing their first value covers the cell


def sweep_params(experiment: str) -> dict[str, str]:
    """The file's own `hydra.sweeper.params` (what `python run.py -m` sweeps)."""
    text = (ROOT / "experiments" / "experiment" / f"{experiment}.yaml").read_text()
    data = yaml.safe_load(text) or {}
    return {
        k: str(v) for k, v in data.get("hydra", {}).get("sweeper", {}).get("params", {}).items()
    }


def sweep_cells(experiment: str) -> list[list[str]]:
    """The sweep's jobs as `python run.py -m +experiment=<name>` forms them (the file's params
    before the command line, as Hydra's basic sweeper), one per cell: repeats at their first."""
    jobs = sweep_jobs(["-m", f"+experiment={experiment}"])
    firsts = {}
    for key in REPEATS:
        values = [o for job in jobs for o in job if o.startswith(f"{key}=")]
        firsts[key] = values[0] if values else None
    return [j for j in jobs if all(v is None or v in j for v in firsts.values())]


def test_every_experiment_is_a_sweep():
    for experiment in PAPER_SCALE:
        assert experiment in EXPERIMENTS, f"experiments/experiment/{experiment}.yaml is missing"
        assert f"{experiment}_cpu" in EXPERIMENTS, f"{experiment} has no _cpu variant"
        assert sweep_params(experiment), f"{experiment} sweeps nothing"


# the paper's grids compose, cell by cell, in tests/test_paper_experiments.py, which plans them
@pytest.mark.parametrize("experiment", sorted(set(EXPERIMENTS) - set(PAPER_EXPERIMENTS)))
def test_every_cell_of_every_other_experiment_composes_into_the_typed_config(experiment, compose):
    jobs = sweep_cells(experiment)
    configs = [compose(job) for job in jobs]
    assert len(configs) == len(jobs) and all(isinstance(c, Config) for c in configs)


def test_paper_settings_reach_the_typed_config(compose):
    # the sweeper's order: a cell's group before the experiment file, whose body comes after
    table3 = compose(
        [
            "+workload=gsm8k",
            "+arm=co_optimized",
            "hardware=tpu_v7x_8",
            "+experiment=stack_comparison",
        ]
    )
    assert (table3.trainer.remat.value, table3.trainer.attention.value) == ("block", "splash")
    assert (table3.steps, table3.dataset.batches_per_pass, table3.dataset.passes) == (40, 20, 2)
    assert (table3.dataset.prompts_per_step, table3.dataset.samples_per_prompt) == (128, 16)
    assert table3.model.param_dtype.value == "bfloat16"  # GSM8K: bf16 trainer weights
    assert table3.opt.freeze_gc and table3.placement.kind.value == "co"
    cell = compose(["+workload=numinamath_cot", "+co_da_cell=c64_da_50", "+experiment=co_vs_da"])
    assert cell.model.compute_dtype.value == "bfloat16"  # MaxText's activations, fp32 weights
    assert cell.model.param_dtype.value == "float32"
    assert (cell.hardware.chips, cell.split, cell.placement.kind.value) == (64, 0.5, "da")
    scale = compose(["+scale_cell=llama3_1_405b_tp16", "+experiment=scale_study"])
    assert (scale.rollout.tensor_parallel, scale.rollout.capacity) == (16, 256)  # 8 waves
    assert (scale.dataset.max_new_tokens, scale.rollout.ignore_eos) == (8192, True)
    assert scale.dataset.kind.value == "openmathinstruct2"  # Section 3.1
    assert scale.model.param_dtype.value == "bfloat16"
    small = compose(["+scale_cell=qwen3_8b_tp4", "+experiment=scale_study"])
    assert (small.rollout.capacity, small.rollout.engine.value) == (1024, "vllm")  # 2 waves
    # Table 3: "LoCoJAX generates in two waves at 8 chips" (GSM8K), one wave from 16 chips on
    for chips, waves in ((8, 2), (16, 1)):
        job = ["+workload=gsm8k", f"hardware=tpu_v7x_{chips}", "+arm=co_base"]
        table3 = compose([*job, "+experiment=stack_comparison"])
        assert resolve_plan(plan_setup(table3)).waves == waves


def dry_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "run.py", *args, "dry_run=true"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


# The command line's dry run of a paper experiment, as a user types it: the scale study's grid,
# the MoE recipe and a one-job file (co_vs_da's multi-job command line: the CPU file's, below).
# Every job of every paper file is planned (by the same `sweep_jobs` expansion and plan) in
# tests/test_paper_experiments.py; a subprocess per file added 40 CPU-seconds and no other path.
DRY_RUN_CLI = ["scale_study", "maxtext_gemma4_recipe", "tunix_recipe"]


@pytest.mark.parametrize("experiment", DRY_RUN_CLI)
@pytest.mark.slow
def test_paper_scale_experiment_dry_runs_one_line_per_job(experiment):
    # one launch or seed (a command-line value replaces the file's): every cell, fewer jobs;
    # tests/test_paper_experiments.py plans every job
    repeats = [f"{key}=0" for key in REPEATS if key in sweep_params(experiment)]
    args = ["-m", f"+experiment={experiment}", *repeats]
    result = dry_run(*args)
    assert result.returncode == 0, result.stderr
    jobs = sweep_jobs([*args, "dry_run=true"])
    if len(jobs) == 1:  # one cell (tunix_recipe's launches set to one): its whole plan
        assert "GiB" in result.stdout and " host" in result.stdout, result.stdout[-2000:]
        return
    lines = [line for line in result.stdout.splitlines() if line.startswith("job ")]
    assert len(lines) == len(jobs)
    assert all(" GiB " in line and " wave" in line for line in lines), lines[:3]


def test_the_cpu_co_vs_da_dry_run_plans_every_arm():
    result = dry_run("-m", "+experiment=co_vs_da_cpu")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("job ")]
    arms = {line.split(":")[0].split("+arm=")[1].split()[0] for line in lines}
    assert {"co_optimized", "da_25", "da_50", "da_75"} <= arms
    assert all("fits" in line and "micro-batch" in line for line in lines)
