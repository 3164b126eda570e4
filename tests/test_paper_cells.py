"""The settings a scale-study cell of the experiment files carries are needed where it carries them.

Every Table H1 cell (experiments/scale_cell/, swept by experiments/experiment/scale_study.yaml)
rematerialises each trainer block, as MaxText's default full remat the paper's Pathways trainer
ran. From 14B up the cell does not fit without it, and the refusal names a remat policy that
fits (nothing allocated). The 405B cells' own workarounds are checked in
tests/test_paper_experiments.py; every cell's verdict against the paper's there too.
"""

import re
from pathlib import Path

from locoexp.compose import compose_configs
from locoexp.errors import ConfigError
from locoexp.planner import check_fit
from locoexp.session.build import plan_setup

CELLS = Path(__file__).resolve().parents[1] / "experiments" / "scale_cell"
LARGE = ("qwen3_14b", "qwen3_32b", "llama3_1_70b", "synthetic_100b", "synthetic_200b")


def test_large_scale_study_cells_need_their_remat():
    names = sorted(p.stem for p in CELLS.glob("*.yaml") if p.stem.startswith(LARGE))
    assert len(names) == 13
    jobs = [[f"+scale_cell={n}", "+experiment=scale_study", "trainer.remat=none"] for n in names]
    unrefused = []
    for name, config in zip(names, compose_configs(jobs), strict=True):
        try:
            check_fit(plan_setup(config))
            unrefused.append(name)
        except ConfigError as error:
            assert re.search(r"does not fit.*it fits with trainer\.remat=", str(error)), name
    assert not unrefused
