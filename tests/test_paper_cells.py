"""Every cell the paper ran plans as fitting its slice (`dry_run=true`; nothing allocated), but
Llama-3.1-405B (locoexp/planner/paper.py: KNOWN_SHORT says why).

Table 1's workloads at 8-64 chips under co and single_controller (Table 3), under da at 8-256
chips with every valid split (Section 4.4, Table F1), and the scale study's ten models at their
TPs on 128 chips (Section 4.1, Table H1), each with the overrides of locoexp/planner/paper.py.
"""

import dataclasses

import pytest

from locoexp import compose
from locoexp.main import plan_setup
from locoexp.planner import check_fit
from locoexp.planner.paper import (
    KNOWN_SHORT,
    WORKAROUNDS,
    grouped_by_split,
    paper_cells,
    scale_cells,
)


def cell_configs(compose_configs, cells):
    grouped = grouped_by_split(cells)
    bases = list(grouped)
    jobs = [[*b, "split=0.5"] if "placement=da" in b else list(b) for b in bases]
    for base, config in zip(bases, compose_configs(jobs), strict=True):
        for label, split in grouped[base]:
            yield label, config if split is None else dataclasses.replace(config, split=split)


@pytest.fixture(scope="module")
def compose_configs():
    return compose.compose_configs


def test_every_cell_of_the_paper_fits_its_slice_but_the_known_short_ones(compose_configs):
    cells = paper_cells(every_split=True)
    assert len(cells) == 24 + 3 * (1 + 3 + 7 + 15 + 31 + 63) + 18
    refused = {}
    for label, config in cell_configs(compose_configs, cells):
        try:
            check_fit(plan_setup(config))
        except Exception as error:  # noqa: BLE001  (collect every refusal, then report them all)
            refused[label] = str(error)
    assert set(refused) == set(KNOWN_SHORT), "\n".join(f"{k}: {v}" for k, v in refused.items())


def test_workarounds_are_needed_where_they_are_named(compose_configs):
    # Without its named settings each such scale-study cell is refused, naming one that fits.
    cells = [(label, o) for label, o in scale_cells() if label in WORKAROUNDS]
    cells = [(label, o) for label, o in cells if label not in KNOWN_SHORT]
    assert len(cells) == 8
    for _, config in cell_configs(compose_configs, cells):
        with pytest.raises(Exception, match="does not fit.*it fits with trainer.remat="):
            check_fit(plan_setup(config))
