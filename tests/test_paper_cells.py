"""Every cell the paper ran plans as fitting its slice (`dry_run=true`; nothing allocated).

Table 1's workloads at 8-64 chips under co and single_controller (Table 3), under da at 8-256
chips with every valid split (Section 4.4, Table F1), and the scale study's ten models at their
TPs on 128 chips (Section 4.1, Table H1), each with the overrides of locoexp/planner/paper.py.
"""

import re

import pytest

from locoexp import compose
from locoexp.errors import ConfigError
from locoexp.planner import check_fit
from locoexp.planner.paper import (
    WORKAROUNDS,
    cell_setups,
    da_cells,
    paper_cells,
    scale_cells,
)
from locoexp.session.build import plan_setup


def cell_configs(compose_configs, cells, refused_by_config=None):
    """(label, plan setup) per cell, through the root Config as `run.py` builds it. A split the
    Config refuses goes to `refused_by_config` (label -> message) instead."""
    for label, setup in cell_setups(cells, compose_configs=compose_configs, setup_of=plan_setup):
        if isinstance(setup, ConfigError):
            refused_by_config[label] = str(setup)
        else:
            yield label, setup


@pytest.fixture(scope="module")
def compose_configs():
    return compose.compose_configs


def test_every_cell_of_the_paper_fits_its_slice(compose_configs):
    cells = paper_cells(every_split=True)
    assert len(cells) == 24 + 3 * (1 + 3 + 7 + 15 + 31 + 63) + 18
    refused, by_config = {}, {}
    for label, config in cell_configs(compose_configs, cells, by_config):  # config: a plan Setup
        try:
            check_fit(config)
        except Exception as error:  # noqa: BLE001  (collect every refusal, then report them all)
            refused[label] = str(error)
    assert not refused, "\n".join(f"{k}: {v}" for k, v in refused.items())
    # The paper's 0.25 and 0.125 splits leave 3H/4 or 7H/8 rollout hosts for 128 or 256 prompts
    # (27 cells): each rollout host admits floor or ceil of P/R groups, so they plan as run.
    paper = {label for label, _ in da_cells(every_split=False)}
    assert len(paper) == 3 * (1 + 2 + 3 + 3 + 3 + 3) and not paper & set(by_config)
    assert "gsm8k da 64 chips split=0.25" in paper
    # The only splits refused are those whose trainer hosts do not divide the 2,048 sequences
    # (each trainer host packs an equal share): 3 trainer hosts of 4, 5 of 8, ...
    for message in by_config.values():
        trainers = int(re.search(r"divisible by the (\d+) trainer hosts", message)[1])
        assert 2048 % trainers, message
    assert len(by_config) == 3 * (1 + 4 + 11 + 26 + 57)


def test_workarounds_are_needed_where_they_are_named(compose_configs):
    # Without its named settings each such scale-study cell is refused, naming one that fits.
    cells = [(label, o) for label, o in scale_cells() if label in WORKAROUNDS]
    assert len(cells) == 10
    remat_only = [(label, o) for label, o in cells if len(WORKAROUNDS[label]) == 1]
    assert len(remat_only) == 9  # 405B TP32: remat=offload alone, as the paper's TP32
    for _, setup in cell_configs(compose_configs, remat_only):
        with pytest.raises(Exception, match="does not fit.*it fits with trainer.remat="):
            check_fit(setup)
    # 405B at TP16 (Table H2) needs both of its settings: each one left out, it is refused.
    dropped = [
        (f"{label} without {setting}", [*o, *(w for w in WORKAROUNDS[label] if w != setting)])
        for label, o in cells
        if label not in dict(remat_only)
        for setting in WORKAROUNDS[label]
    ]
    assert len(dropped) == 2
    for _, setup in cell_configs(compose_configs, dropped):
        with pytest.raises(Exception, match="does not fit"):
            check_fit(setup)
