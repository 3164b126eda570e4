"""Dry-run plans of every cell of the paper's experiment files, as a markdown table.

    python tools/plan_paper_cells.py [experiment ...] > table.md   # default: all ten grids

Each cell is a job of `python run.py -m +experiment=<name> dry_run=true`, the file's own sweep
expanded as the dry run expands it (launches and seeds plan alike: one row per cell); the
experiment files are the one source of the cells. Nothing is allocated. Columns: the verdict
("fits", "fits with accumulation": only by accumulating gradients over micro-batches, which the
paper's trainer does not; or the refusal), trainer and engine peak GiB per device, what the
paper's layout (`trainer.accumulate=false`) would need where it does not fit, micro-batches and
decode waves. tests/test_paper_experiments.py sets each verdict beside the paper's.
"""

import argparse
import re

from locoexp.compose import cell_of, compose_configs, sweep_jobs
from locoexp.planner import resolve_plan
from locoexp.planner.estimate import GIB
from locoexp.planner.paper import PAPER_EXPERIMENTS, verdict_category
from locoexp.planner.report import verdict_of
from locoexp.session.build import plan_setup


def experiment_rows(experiment: str) -> list[list[str]]:
    """One row per cell of `experiment`'s sweep."""
    jobs = sweep_jobs(["-m", f"+experiment={experiment}"])
    rows: dict[str, list[str]] = {}
    for job, config in zip(jobs, compose_configs(jobs), strict=True):
        cell = cell_of(job)
        if cell in rows:
            continue
        setup = plan_setup(config)
        verdict, plan = verdict_of(setup), resolve_plan(setup)
        need = re.search(r"needs ([0-9.]+) GiB", verdict)
        rows[cell] = [
            experiment,
            cell,
            verdict_category(verdict),
            f"{plan.trainer_peak / GIB:.1f} / {plan.engine_peak / GIB:.1f}",
            need[1] if need else "-",
            str(plan.trainer_shape.micro_batches),
            str(plan.waves),
        ]
    return list(rows.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiments", nargs="*", default=PAPER_EXPERIMENTS)
    args = parser.parse_args()
    print(
        "| experiment | cell | plan | trainer / engine GiB per device | paper layout needs GiB "
        "| micro-batches | waves |"
    )
    print("|---|---|---|---|---|---|---|")
    for experiment in args.experiments:
        for row in experiment_rows(experiment):
            print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
