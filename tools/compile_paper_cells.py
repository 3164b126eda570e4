"""Every cell of the paper's experiment files compiled for its TPU slice by XLA, as a table.

    python tools/compile_paper_cells.py [experiment ...] [--cache cells.jsonl] > table.md

Each cell (one job of `python run.py -m +experiment=<name>`, launches and seeds compile alike)
is compiled as `dry_run=compile` compiles it (locoexp/compiled; libtpu, no TPU) and set beside
what the paper says of it (`planner.paper.PAPER`: ran, did not fit, not run). A compile of a
0.6B-class cell takes minutes on two cores, so the whole set takes hours: each finished cell
is appended to the cache file (one JSON line) and skipped when the tool is run again while its
programs are unchanged (a cell whose experiment files changed compiles again), and cells whose
programs are the same (arms that differ only by O1-O4 or the admission path) compile
once. `--layout paper` (the default) compiles the paper's trainer, every packed row in one
pass (`trainer.accumulate=false`), which is what the paper's verdicts are about. Columns:
experiment, cell, the paper's verdict and where it says so, the plan's trainer /
engine GiB per device, XLA-TPU's (an engine under `rollout=vllm` keeps the plan's: vLLM's
programs are not locoexp's), XLA's verdict, compile seconds.
"""

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from locoexp.compiled.worker import compile_pooled
from locoexp.compose import cell_of, compose_configs, sweep_jobs, use_cpu_backend
from locoexp.config import Config
from locoexp.errors import ConfigError
from locoexp.planner import resolve_plan
from locoexp.planner.estimate import GIB
from locoexp.planner.paper import PAPER, PAPER_EXPERIMENTS
from locoexp.session.build import config_as_dict, plan_setup

# Keys that change no compiled program: the step loop's levers, repeats, logging and schedule.
SAME_PROGRAMS = ("opt", "launch", "seed", "steps", "logger", "dry_run", "eval_every_steps")


def _set_values(value: Any) -> Any:
    """A config's values that differ from their fields' defaults (enums by value): a key added
    later at its default leaves every cached cell's key as it was."""
    if not dataclasses.is_dataclass(value):
        return [_set_values(v) for v in value] if isinstance(value, list | tuple) else value
    kept = {}
    for field in dataclasses.fields(value):
        now = getattr(value, field.name)
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = dataclasses.MISSING
        if now != default:
            kept[field.name] = _set_values(now)
    return {k: getattr(v, "value", v) for k, v in kept.items()}


# What a program's footprint is read from (`ProgramMemory.footprint`): a cached cell written
# before XLA-TPU's peak replaced argument + temp is compiled again.
FOOTPRINT = "xla-tpu peak"


def program_key(config: Config) -> str:
    """Cells with equal keys compile the same programs: the config's set values, less the
    keys that change no program. (A change of the code or of a default is not in the key:
    start a new cache file then.)"""
    kept = {k: v for k, v in _set_values(config).items() if k not in SAME_PROGRAMS}
    return json.dumps(kept, sort_keys=True, default=str)


def _leaves(tree: dict, path: tuple = ()) -> dict[tuple, Any]:
    out: dict[tuple, Any] = {}
    for name, value in tree.items():
        out |= _leaves(value, (*path, name)) if isinstance(value, dict) else {(*path, name): value}
    return out


def written_with_every_value(stored: str, config: Config) -> bool:
    """Whether a cache line written before `program_key` left defaults out (every value of the
    config then) is this config's: each value it holds is the config's, and each key it lacks
    (added since) is at its default. Such cells are not compiled again."""
    old = _leaves(json.loads(stored))
    now = {k: v for k, v in config_as_dict(config).items() if k not in SAME_PROGRAMS}
    set_now = _leaves(json.loads(program_key(config)))
    return all(
        (old[path] == value) if path in old else (path not in set_now)
        for path, value in _leaves(json.loads(json.dumps(now, default=str))).items()
    )


def compile_cell(config: Config) -> dict:
    """The cell's figures from XLA-TPU (or its refusal, one sentence)."""
    try:
        result = compile_pooled(config)  # in a child: libtpu's aborts end only the cell
    except ConfigError as error:
        return {"refused": str(error)}
    plan = result.plan
    return {
        "footprint": FOOTPRINT,
        "plan": [plan.trainer_peak / GIB, plan.engine_peak / GIB],
        "xla": [result.role_peak("trainer") / GIB, result.role_peak("engine") / GIB],
        "engine_compiled": result.engine_compiled,
        "fits": result.fits,
        "xla_refusal": result.refusals[0].refusal if result.refusals else None,
        "seconds": result.compile_seconds,
        "programs": {f"{p.role}/{p.name}": [p.footprint / GIB, p.seconds] for p in result.programs},
    }


def with_current_plan(config: Config, figures: dict) -> dict:
    """The cached figures with the plan's peaks as the planner gives them now (the plan is
    milliseconds; a cache written before a planner change keeps its XLA figures only); an
    engine whose programs were not compiled (`rollout=vllm`) stays the plan's on both sides."""
    if "refused" in figures:
        return figures
    plan = resolve_plan(plan_setup(config))
    now = [plan.trainer_peak / GIB, plan.engine_peak / GIB]
    xla = figures["xla"] if figures["engine_compiled"] else [figures["xla"][0], now[1]]
    limit = config.hardware.memory_per_device_gib
    fits = not figures.get("xla_refusal") and max(xla) <= limit
    return figures | {"plan": now, "xla": xla, "fits": fits}


def row(experiment: str, cell: str, figures: dict) -> str:
    paper = {(e, c): (v, where) for e, c, v, where in PAPER}.get((experiment, cell), ("-", ""))
    if "refused" in figures:
        return f"| {experiment} | {cell} | {paper[0]} ({paper[1]}) | - | - | refused: " + (
            f"{figures['refused']} | - |"
        )
    plan, xla = figures["plan"], figures["xla"]
    engine = f"{xla[1]:.1f}" if figures["engine_compiled"] else f"({plan[1]:.1f}, vLLM: plan)"
    verdict = "fits" if figures["fits"] else "does not fit"
    if figures.get("xla_refusal"):
        verdict += " (XLA: out of memory)"
    return (
        f"| {experiment} | {cell} | {paper[0]} ({paper[1]}) | {plan[0]:.1f} / {plan[1]:.1f} | "
        f"{xla[0]:.1f} / {engine} | {verdict} | {figures['seconds']:.0f} |"
    )


def summary(rows: list[tuple[str, str, dict]]) -> list[str]:
    """The count the paper's verdicts hold by XLA, and plan / XLA per role (median, worst)."""
    paper = {(e, c): v for e, c, v, _ in PAPER}
    agree, judged, ratios = 0, 0, {"trainer": [], "engine": []}
    for experiment, cell, figures in rows:
        if "refused" in figures:
            continue
        said = paper.get((experiment, cell))
        if said in ("ran", "did not fit"):
            judged += 1
            agree += figures["fits"] == (said == "ran")
        ratios["trainer"].append(figures["plan"][0] / figures["xla"][0])
        if figures["engine_compiled"]:
            ratios["engine"].append(figures["plan"][1] / figures["xla"][1])
    lines = [f"XLA-TPU agrees with the paper's ran / did not fit on {agree} of {judged} cells"]
    for role, values in ratios.items():
        if values:
            worst = max(values, key=lambda r: abs(r - 1))
            lines.append(
                f"plan / XLA-TPU, {role} peak: median {statistics.median(values):.2f}, worst "
                f"{worst:.2f} over {len(values)} cells"
            )
    return lines


def cell_figures(experiment, cell, config, done: dict, by_programs: dict, args) -> None:
    """The cell's figures into `done` (and the cache file): compiled when new, changed since,
    or written before the footprint was XLA-TPU's peak; cells of equal programs compile once."""
    key = program_key(config)
    cached = done.get((experiment, cell, args.layout))
    if cached is not None and written_with_every_value(cached["key"], config):
        cached["key"] = key  # written before defaults were left out of the key
    current = cached is not None and cached["key"] == key
    if current and (
        "refused" in cached["figures"] or cached["figures"].get("footprint") == FOOTPRINT
    ):
        by_programs.setdefault(key, cached["figures"])
        return
    figures = by_programs.get(key) or compile_cell(config)
    by_programs[key] = figures
    entry = {"experiment": experiment, "cell": cell, "layout": args.layout}
    entry |= {"key": key, "figures": figures}
    done[(experiment, cell, args.layout)] = entry
    with args.cache.open("a") as cache:
        cache.write(json.dumps(entry) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiments", nargs="*", default=PAPER_EXPERIMENTS)
    parser.add_argument("--cache", type=Path, default=Path("compiled_paper_cells.jsonl"))
    parser.add_argument("--cells", nargs="*", help="only these cells (their names as printed)")
    parser.add_argument(
        "--layout",
        choices=("paper", "locoexp"),
        default="paper",
        help="paper: the paper's trainer (every packed row at once, trainer.accumulate=false), "
        "what its verdicts are about; locoexp: the plan's micro-batches",
    )
    args = parser.parse_args()
    extra = ["trainer.accumulate=false"] if args.layout == "paper" else []
    use_cpu_backend()
    done = {}
    if args.cache.exists():
        for line in args.cache.read_text().splitlines():
            entry = json.loads(line)
            done[(entry["experiment"], entry["cell"], entry["layout"])] = entry
    by_programs = {
        entry["key"]: entry["figures"]
        for entry in done.values()
        if entry["figures"].get("footprint") == FOOTPRINT
    }
    print(
        "| experiment | cell | paper | plan GiB trainer / engine | XLA-TPU GiB trainer / engine "
        "| XLA's verdict | compile s |"
    )
    print("|---|---|---|---|---|---|---|", flush=True)
    printed = []
    for experiment in args.experiments:
        jobs = sweep_jobs(["-m", f"+experiment={experiment}", *extra])
        seen = set()
        for job, config in zip(jobs, compose_configs(jobs), strict=True):
            cell = cell_of([o for o in job if not o.startswith("trainer.accumulate=")])
            if cell in seen or (args.cells and cell not in args.cells):
                continue
            seen.add(cell)
            cell_figures(experiment, cell, config, done, by_programs, args)
            figures = with_current_plan(config, done[(experiment, cell, args.layout)]["figures"])
            printed.append((experiment, cell, figures))
            print(row(experiment, cell, figures), flush=True)
    print()
    print("\n".join(summary(printed)))


if __name__ == "__main__":
    sys.exit(main())
