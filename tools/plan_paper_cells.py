"""Dry-run plans of every cell the paper ran, as a markdown table (GiB per device, waves).

    python tools/plan_paper_cells.py [--every-split] > table.md

Each cell is `python run.py <overrides> dry_run=true` (locoexp/planner/paper.py lists them);
nothing is allocated. Columns: trainer and engine peak GiB per device (colocated peaks include
the other role's resident state), rows per micro-batch x micro-batches (trainer.micro_batch_rows
resolved), sequences per engine per wave x waves (rollout.capacity resolved), the settings the
cell needs beyond the paper's, and the verdict.
"""

import argparse

from locoexp.compose import compose_configs
from locoexp.errors import ConfigError
from locoexp.planner import check_fit, resolve_plan
from locoexp.planner.estimate import GIB
from locoexp.planner.paper import WORKAROUNDS, cell_setups, paper_cells
from locoexp.session.build import plan_setup


def table_row(label: str, setup) -> str:
    if isinstance(setup, ConfigError):
        return f"| {label} | - | - | - | - | - | - | refused by the config: {setup} |"
    try:
        check_fit(setup)
        verdict = "fits"
    except ConfigError as error:
        verdict = str(error)
    p = resolve_plan(setup)
    s = p.trainer_shape
    extra = " ".join(WORKAROUNDS.get(label, [])) or "-"
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
    cells = paper_cells(every_split=args.every_split)
    for label, setup in cell_setups(cells, compose_configs=compose_configs, setup_of=plan_setup):
        print(table_row(label, setup), flush=True)


if __name__ == "__main__":
    main()
