"""Create the project's W&B workspace: the report's panels, runs grouped by placement and chips.

    python tools/dashboard_wandb.py --entity ENTITY [--project locoexp] [--name NAME] [--dry-run]

The panels are those of locoexp/metrics/panels.py (`python -m locoexp.analysis figures` draws
the same ones as PNG):
step time by phase (stacked per step), step time, host-orchestration share, decode time per
iteration, reward, held-out accuracy against the global step (`step`, the logger's x axis), and
cost-to-learn from each run's summary (`cost/chip_hours`, `cost/usd`). Saving needs a W&B account
and network; `--dry-run` builds the same workspace and prints its panels without either.
Needs the `dashboards` extra: `pip install -e .[dashboards]`.
"""

import argparse
from collections.abc import Sequence

import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws

from locoexp.metrics.panels import GROUP_BY, SECTIONS, STEP_KEY, Panel, PanelKind

DEFAULT_NAME = "locoexp: step time, learning, cost-to-learn"


def build_workspace(*, entity: str, project: str, name: str = DEFAULT_NAME) -> ws.Workspace:
    """The workspace object; nothing is sent until `.save()`."""
    return ws.Workspace(
        entity=entity,
        project=project,
        name=name,
        sections=[
            ws.Section(
                name=section.name, panels=[build_panel(p) for p in section.panels], is_open=True
            )
            for section in SECTIONS
        ],
        settings=ws.WorkspaceSettings(x_axis=STEP_KEY),
        runset_settings=ws.RunsetSettings(groupby=[ws.Config(key) for key in GROUP_BY]),
    )


def build_panel(panel: Panel) -> wr.LinePlot | wr.BarPlot:
    match panel.kind:
        case PanelKind.line:
            return wr.LinePlot(
                title=panel.title,
                x=STEP_KEY,
                y=list(panel.ys),
                title_x="global step",
                title_y=panel.y_label,
            )
        case PanelKind.stacked:
            return wr.LinePlot(
                title=panel.title,
                x=STEP_KEY,
                y=list(panel.ys),
                plot_type="stacked-area",
                title_x="global step",
                title_y=panel.y_label,
            )
        case PanelKind.bar:
            # Bars read each run's summary, where the step engine writes cost/* at the end.
            return wr.BarPlot(
                title=panel.title,
                metrics=list(panel.ys),
                orientation="v",
                title_y=panel.y_label,
                groupby_aggfunc="mean",
                groupby_rangefunc="minmax",
            )


def describe_workspace(workspace: ws.Workspace) -> str:
    """What a user reads before saving: grouping, then every section's panels and keys."""
    groupby = ", ".join(key.name for key in workspace.runset_settings.groupby)
    lines = [
        f"workspace {workspace.name!r} in {workspace.entity}/{workspace.project}",
        f"x axis: {workspace.settings.x_axis}; runs grouped by: {groupby}",
    ]
    for section in workspace.sections:
        lines.append(f"[{section.name}]")
        for panel in section.panels:
            if isinstance(panel, wr.LinePlot):
                kind, keys = f"{panel.plot_type or 'line'} plot", panel.y
            else:
                kind, keys = "bar chart", panel.metrics
            lines.append(f"  {panel.title}: {kind} of {', '.join(keys)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> ws.Workspace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entity", required=True, help="W&B entity (user or team)")
    parser.add_argument("--project", default="locoexp", help="W&B project (logger.project)")
    parser.add_argument("--name", default=DEFAULT_NAME, help="name of the saved view")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="build and print the workspace without saving it (no network)",
    )
    args = parser.parse_args(argv)
    workspace = build_workspace(entity=args.entity, project=args.project, name=args.name)
    print(describe_workspace(workspace))
    if not args.dry_run:
        workspace.save()
        print(f"saved: {workspace.url}")
    return workspace


if __name__ == "__main__":
    main()
