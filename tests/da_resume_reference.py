"""The golden uninterrupted run of test_da_survival's exact-resume test (issue 44):
`fixtures/da_resume_reference.json` holds, for each staleness the test resumes at, what the
uninterrupted `da` run of `STALE_RUN` trained (each step's batch: its prompts and its shares'
weight versions) and logged (loss, reward, staleness), read from its ledger and metrics exactly
as the test reads the resumed run's.

A run is deterministic across processes (the test compared two such runs exactly, each step's
floats equal), so the test compares the resumed run with the recorded one instead of running the
uninterrupted one again. Recorded by running it, after a change that moves what a seed trains:

    python tests/da_resume_reference.py
"""

import json
import sys
from pathlib import Path

from locoexp.metrics.run_records import read_metrics_jsonl

PATH = Path(__file__).parent / "fixtures/da_resume_reference.json"
STALENESS = (3,)  # the staleness the test resumes at (see test_da_survival)
STALE_STEPS = 6
# one trainer host and two rollout hosts, one of them slowed each step, so the hosts run at their
# own pace and a checkpoint after k updates finds batches k .. k+s-1 in flight at different
# stages on each host
STALE_RUN = [
    "placement=da",
    "hardware.hosts=3",
    "split=0.333",
    "logger=none",
    "seed=0",
    f"steps={STALE_STEPS}",
    "eval_every_steps=0",
    "checkpoint_every_steps=2",
    "dataset.prompts_per_step=4",
    "dataset.samples_per_prompt=4",
    "dataset.synthetic.held_out_size=8",
    "rollout.straggler.delay_s=0.3",  # one rollout host per step, a seeded draw
]
LOGGED = ("train/loss", "rollout/reward_mean", "train/staleness_steps")


def overrides(staleness: int) -> list[str]:
    return [*STALE_RUN, f"placement.max_staleness={staleness}"]


def batches_trained(run_dir: Path) -> list[list]:
    """Each step's batch as the ledger has it: its prompts and its shares' weight versions."""
    path = run_dir / "batches.jsonl"  # JSON lines like metrics.jsonl (a cut last line skipped)
    rows = [row for row in read_metrics_jsonl(path) if "example_ids" in row]
    return [[r["step"], r["example_ids"], r["weight_versions"]] for r in rows]


def steps_logged(run_dir: Path) -> list[list]:
    """Each step's number and its `LOGGED` values, in the order logged."""
    rows = read_metrics_jsonl(run_dir / "metrics.jsonl")
    return [[r["step"], *(r[k] for k in LOGGED)] for r in rows if "eval/accuracy" not in r]


def record(run_dir: Path) -> dict:
    return {"batches": batches_trained(run_dir), "steps": steps_logged(run_dir)}


def load() -> dict[int, dict]:
    """staleness -> the recorded run's `record`, the overrides checked against today's."""
    recorded = json.loads(PATH.read_text())
    runs = {int(s): run for s, run in recorded["runs"].items()}
    for staleness, run in runs.items():
        assert run["overrides"] == overrides(staleness), (
            f"{PATH.name} was recorded with other overrides: python tests/{Path(__file__).name}"
        )
    return runs


def main() -> None:
    import os  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    # the XLA flags and backend every process of a test session has (tests/conftest.py): the
    # recorded floats are those of the programs the test's runs compile
    os.environ["XLA_FLAGS"] = (
        "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    )
    os.environ["JAX_PLATFORMS"] = "cpu"

    from locoexp.compose import compose_config  # noqa: PLC0415
    from locoexp.main import run  # noqa: PLC0415

    runs = {}
    for staleness in STALENESS:
        with tempfile.TemporaryDirectory() as folder:
            run_dir = Path(folder) / "run"
            run(compose_config(overrides(staleness)), run_dir=run_dir, progress=False)
            runs[str(staleness)] = {"overrides": overrides(staleness), **record(run_dir)}
    PATH.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    print(f"wrote {PATH}", file=sys.stderr)


if __name__ == "__main__":
    main()
