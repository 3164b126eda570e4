"""Dry-run plans of every cell the paper ran, as a markdown table (GiB per device, waves).

    python tools/plan_paper_cells.py [--every-split] > table.md

Each cell is `python run.py <overrides> dry_run=true` (locoexp/planner/paper.py lists them);
nothing is allocated. Columns: trainer and engine peak GiB per device (colocated peaks include
the other role's resident state), rows per micro-batch x micro-batches (trainer.micro_batch_rows
resolved), sequences per engine per wave x waves (rollout.capacity resolved), the settings the
cell needs beyond the paper's, and the verdict.
"""

import argparse
import dataclasses

from locoexp.compose import compose_configs
from locoexp.errors import ConfigError
from locoexp.main import plan_setup
from locoexp.planner import Roles, check_fit, resolve_plan
from locoexp.planner.estimate import GIB
from locoexp.planner.paper import WORKAROUNDS, grouped_by_split, paper_cells


def planned_setups(every_split: bool):
    """(label, plan setup) of every cell, each base composed once. A da split whose hosts do
    not divide the batch (the root Config refuses it) is planned from its roles directly."""
    grouped = grouped_by_split(paper_cells(every_split=every_split))
    bases = list(grouped)
    jobs = [[*b, "split=0.5"] if "placement=da" in b else list(b) for b in bases]
    for base, config in zip(bases, compose_configs(jobs), strict=True):
        for label, split in grouped[base]:
            if split is None:
                yield label, plan_setup(config)
                continue
            try:
                yield label, plan_setup(dataclasses.replace(config, split=split))
            except ConfigError:
                trainers = round(split * config.hardware.hosts)
                roles = Roles(
                    trainer_hosts=trainers,
                    rollout_hosts=config.hardware.hosts - trainers,
                    colocated=False,
                    kl_reference=config.algo.kl_coef > 0,
                )
                yield label + " (uneven)", dataclasses.replace(plan_setup(config), roles=roles)


def table_row(label: str, setup) -> str:
    try:
        check_fit(setup)
        verdict = "fits"
    except ConfigError as error:
        verdict = str(error)
    p = resolve_plan(setup)
    s = p.trainer_shape
    extra = " ".join(WORKAROUNDS.get(label.removesuffix(" (uneven)"), [])) or "-"
    return (
        f"| {label} | {p.trainer_peak / GIB:.1f} | {p.engine_peak / GIB:.1f} | "
        f"{s.micro_batch_rows} x {s.micro_batches} | {p.capacity} x {p.waves} | "
        f"TP{setup.rollout.tensor_parallel} | {extra} | {verdict} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every-split", action="store_true", help="every valid da split")
    args = parser.parse_args()
    print(
        "| cell | trainer GiB/device | engine GiB/device | micro-batch rows x count | "
        "sequences per engine per wave x waves | TP | beyond the paper | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, setup in planned_setups(args.every_split):
        print(table_row(label, setup), flush=True)


if __name__ == "__main__":
    main()
