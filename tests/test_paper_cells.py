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


def _compile_cells_tool():
    import importlib.util  # noqa: PLC0415

    path = Path(__file__).resolve().parents[1] / "tools" / "compile_paper_cells.py"
    spec = importlib.util.spec_from_file_location("compile_paper_cells", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cells_cache_keys_leave_defaults_out():
    """A key added at its default keeps every cached cell's key (the cells compile for hours);
    a line written with every value, before a key existed, still names its cell."""
    import dataclasses  # noqa: PLC0415
    import json  # noqa: PLC0415

    tool = _compile_cells_tool()
    (config,) = compose_configs([["hardware=tpu_v7x_8", "dataset=gsm8k"]])
    key = json.loads(tool.program_key(config))
    assert "kv_cache" not in key.get("rollout", {}) and key["hardware"]
    full = json.loads(json.dumps(tool.config_as_dict(config), default=str))
    del full["rollout"]["kv_cache"]  # a line written before rollout.kv_cache existed
    assert tool.written_with_every_value(json.dumps(full), config)
    paged = dataclasses.replace(
        config, rollout=dataclasses.replace(config.rollout, kv_cache="paged")
    )
    assert not tool.written_with_every_value(json.dumps(full), paged)
    assert tool.program_key(paged) != tool.program_key(config)
    full["dataset"]["max_new_tokens"] += 1  # a value the cell no longer has
    assert not tool.written_with_every_value(json.dumps(full), config)
