"""tools/dashboard_wandb.py builds the W&B workspace offline: every panel, grouped by design."""

from pathlib import Path

import pytest

from locoexp.metrics.panels import GROUP_BY, PHASE_KEYS, SECTIONS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def dashboard(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    import dashboard_wandb

    return dashboard_wandb


def panel_keys(panel):
    return list(panel.y) if hasattr(panel, "y") else list(panel.metrics)


def test_workspace_has_every_panel_grouped_by_placement_and_chips(dashboard):
    workspace = dashboard.build_workspace(entity="someone", project="locoexp")
    assert [s.name for s in workspace.sections] == [s.name for s in SECTIONS]
    built = {p.title: panel_keys(p) for s in workspace.sections for p in s.panels}
    assert built["Step time by phase"] == list(PHASE_KEYS)
    assert built["Reward"] == ["rollout/reward_mean"]
    assert built["Held-out accuracy"] == ["eval/accuracy"]
    assert built["Chip-hours to the target"] == ["cost/chip_hours"]
    assert [key.name for key in workspace.runset_settings.groupby] == list(GROUP_BY)
    assert workspace.settings.x_axis == "step"
    # The saved form is built locally too (what .save() would send), without a network call.
    saved = workspace._to_model().model_dump(by_alias=True)
    assert saved["entity"] == "someone" and saved["project"] == "locoexp"


def test_dry_run_prints_the_panels_without_saving(dashboard, capsys):
    dashboard.main(["--entity", "someone", "--dry-run"])
    printed = capsys.readouterr().out
    assert "runs grouped by: placement.kind, hardware.chips" in printed
    for title in ("Step time by phase", "Reward", "Held-out accuracy", "Chip-hours to the target"):
        assert title in printed
    assert "saved:" not in printed
