"""`python -m locoexp.analysis predict`: each cell's decode iteration from its compiled program
(locoexp/analysis/predict.py), and with `--anchors` the paper's figures beside the predictions
(locoexp/analysis/anchors.py).

    predict stack_comparison                       every cell of an experiment file
    predict RUN_DIR                                one run (its .hydra/overrides.yaml)
    predict model=qwen3_4b rollout.tensor_parallel=2 hardware=tpu_v7x_64 ...   one config
    predict --anchors                              Figure 7b, App. C's weight times and TP verdicts,
                                                   Table 3, Table H1's fastest TP, Table F1 winners

A cell whose model, TP and dtype have no compiled iteration in the cache is listed with the
command that compiles it. Never imports jax.
"""

import argparse
from pathlib import Path

import yaml

from locoexp.analysis import anchors, predict, step, table3, table_f1, table_h1
from locoexp.compose import cell_of, compose_configs, sweep_jobs
from locoexp.errors import ConfigError

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments" / "experiment"


def add_predict(commands) -> None:
    p = commands.add_parser("predict", help="Eq. 2's decode iteration from compiled programs")
    p.add_argument("targets", nargs="*", help="an experiment name, a run directory, or overrides")
    p.add_argument("--anchors", action="store_true", help="the paper's figures beside each")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run_predict, format=format_predict)


def jobs_of(targets: list[str]) -> list[list[str]]:
    """The jobs the targets name: an experiment file's sweep, a run's overrides, or one job of
    the overrides given."""
    if not targets:
        return []
    if len(targets) == 1 and (EXPERIMENTS / f"{targets[0]}.yaml").exists():
        jobs = sweep_jobs(["-m", f"+experiment={targets[0]}"])
        return [job for job in jobs if not any(o.startswith("launch=") and o != "launch=0"
                                               for o in job)]  # fmt: skip
    if len(targets) == 1 and Path(targets[0]).is_dir():
        overrides = Path(targets[0]) / ".hydra" / "overrides.yaml"
        if not overrides.exists():
            raise ConfigError(f"{targets[0]} is a directory without .hydra/overrides.yaml.")
        return [list(yaml.safe_load(overrides.read_text()))]
    if all("=" in t for t in targets):
        return [targets]
    raise ConfigError(
        f"predict takes an experiment name (one of experiments/experiment/), a run directory or "
        f"overrides (key=value); got {targets}."
    )


def run_predict(args: argparse.Namespace) -> dict:
    cache, lengths = predict.read_decode_figures(), predict.read_length_mix()
    jobs, verdicts = jobs_of(args.targets), predict.read_fit_verdicts()
    experiment = args.targets[0] if len(args.targets) == 1 else ""
    rows = []
    for job, config in zip(jobs, compose_configs(jobs) if jobs else [], strict=True):
        cell = cell_of(job) or " ".join(job)
        try:
            row = cell_row(cell, config, cache, lengths)
        except ConfigError as refusal:
            row = {"cell": cell, "not predicted": str(refusal)}
        # tools/compile_paper_cells.py's verdict (every row at the caps); blank where not compiled
        fit = verdicts.get((experiment, cell), "")
        rows.append(row | {"fit, paper's layout at the caps": fit})
    out: dict = {"cells": rows}
    if args.anchors:
        (config,) = compose_configs([anchors.FIGURE_7B[1]])
        out["anchors"] = anchors.anchor_tables(cache, config)
        cells = table3.cells()
        configs = compose_configs([table3.job(*c) for c in cells])
        out["anchors"]["table_3"] = table3.table3_rows(cells, table3.shapes(cells, configs, cache))
        h1 = table_h1.table_h1_rows(cache)
        out["anchors"]["table_h1"] = h1
        out["anchors"]["table_h1_fastest_tp"] = table_h1.fastest_tp(h1)
        out["anchors"]["table_f1"] = table_f1.table_f1_rows(cache)
    if not jobs and not args.anchors:
        raise ConfigError(
            "predict needs a target (experiment, run directory, overrides) or --anchors."
        )
    return out


def cell_row(cell: str, config, cache, lengths) -> dict:
    """Eq. 2's iteration as decode starts and, for a colocated cell of a workload with a fitted
    phi, the step (locoexp/analysis/step.py)."""
    shape = predict.cell_shape(cell, config, lengths)
    row = predict.predict_cell(shape, cache)
    if config.layout.colocated and config.dataset.kind.value in step.PHI:
        figures = predict.decode_figures(cache, model=shape.model, tp=shape.tp, dtype=shape.dtype)
        got = step.predict_cell_step(step.step_shape(shape, config), figures)
        row |= {f"{k}_s": round(v, 3) for k, v in got.items() if k != "iterations"}
        row["iterations"] = round(got["iterations"])
    return row


def _table(rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(row.get(k, "")) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def format_predict(result: dict) -> str:
    """Markdown tables: the cells (ms per decode iteration, Eq. 2's terms), then each anchor."""
    parts = []
    predicted = [r for r in result["cells"] if "not predicted" not in r]
    missing = [r for r in result["cells"] if "not predicted" in r]
    if predicted:
        parts.append(
            "Decode iteration per TensorCore as decode starts (Eq. 2, ms):\n" + _table(predicted)
        )
    if missing:
        parts.append("Not predicted:\n" + _table(missing))
    for name, rows in result.get("anchors", {}).items():
        parts.append(f"Anchor {name}:\n" + _table(rows))
    return "\n\n".join(parts)
