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
from locoexp.planner import Roles, check_fit
from locoexp.planner.paper import (
    KNOWN_SHORT,
    WORKAROUNDS,
    grouped_by_split,
    paper_cells,
    scale_cells,
)


def cell_configs(compose_configs, cells, uneven=None):
    """(label, config) per cell; a da split whose hosts do not divide the batch (Config refuses
    it: whole GRPO groups per rollout host) goes to `uneven` instead."""
    grouped = grouped_by_split(cells)
    bases = list(grouped)
    jobs = [[*b, "split=0.5"] if "placement=da" in b else list(b) for b in bases]
    for base, config in zip(bases, compose_configs(jobs), strict=True):
        for label, split in grouped[base]:
            if split is None:
                yield label, plan_setup(config)
                continue
            trainers = round(split * config.hardware.hosts)
            d = config.dataset
            if d.prompts_per_step % (config.hardware.hosts - trainers) or (
                d.prompts_per_step * d.samples_per_prompt % trainers
            ):
                uneven.append(label)
                roles = Roles(
                    trainer_hosts=trainers,
                    rollout_hosts=config.hardware.hosts - trainers,
                    colocated=False,
                    kl_reference=config.algo.kl_coef > 0,
                )
                yield label, dataclasses.replace(plan_setup(config), roles=roles)
                continue
            yield label, plan_setup(dataclasses.replace(config, split=split))


@pytest.fixture(scope="module")
def compose_configs():
    return compose.compose_configs


def test_every_cell_of_the_paper_fits_its_slice_but_the_known_short_ones(compose_configs):
    cells = paper_cells(every_split=True)
    assert len(cells) == 24 + 3 * (1 + 3 + 7 + 15 + 31 + 63) + 18
    refused, uneven = {}, []
    for label, config in cell_configs(compose_configs, cells, uneven):  # config: a plan Setup
        try:
            check_fit(config)
        except Exception as error:  # noqa: BLE001  (collect every refusal, then report them all)
            refused[label] = str(error)
    assert set(refused) == set(KNOWN_SHORT), "\n".join(f"{k}: {v}" for k, v in refused.items())
    # the paper's own splits all divide the batch from 32 chips up (0.25 and 0.125 of 2-4 hosts
    # leave 3 or 7 rollout hosts for 128 or 256 prompts)
    # main's Config refuses these (rollout hosts must divide the prompts): they are planned from
    # their roles directly. Among them are the paper's 0.25 and 0.125 splits of 128/256 prompts.
    assert "gsm8k da 64 chips split=0.25" in uneven


def test_workarounds_are_needed_where_they_are_named(compose_configs):
    # Without its named settings each such scale-study cell is refused, naming one that fits.
    cells = [(label, o) for label, o in scale_cells() if label in WORKAROUNDS]
    cells = [(label, o) for label, o in cells if label not in KNOWN_SHORT]
    assert len(cells) == 8
    for _, setup in cell_configs(compose_configs, cells):
        with pytest.raises(Exception, match="does not fit.*it fits with trainer.remat="):
            check_fit(setup)
