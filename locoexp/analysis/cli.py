"""The subcommands of `python -m locoexp.analysis`: arguments in, a JSON-ready result out.

Each `add_*` registers one subcommand with `run` (arguments -> result dict) and `format`
(result -> the table printed). Nothing here computes a statistic itself; it reads run
directories and hands them to compare, accounting, recommend, cost and figures.
"""

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from locoexp.analysis import accounting, compare, cost, quality, recommend
from locoexp.analysis.runs import Run, find_runs, require_one_cell, select
from locoexp.errors import ConfigError


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument(
        "--steady",
        metavar="FIRST:LAST",
        help="steady steps (default: Appendix A's second pass, steps 23-38 of 40, scaled)",
    )


# compare ------------------------------------------------------------------------------------


def add_compare(commands) -> None:
    p = commands.add_parser("compare", help="Appendix A: two arms, bootstrap ratios, verdict")
    p.add_argument("paths", nargs="+", type=Path, help="BASELINE OURS, or sweep/run folders")
    p.add_argument("--baseline", nargs="+", default=[], metavar="KEY=VALUE")
    p.add_argument("--ours", nargs="+", default=[], metavar="KEY=VALUE")
    p.add_argument("--rule", choices=[compare.Rule.stacks, compare.Rule.within, compare.Rule.rung])
    _common(p)
    p.set_defaults(run=run_compare, format=compare.format_comparison)


def run_compare(args) -> dict:
    if args.baseline or args.ours:
        runs = find_runs(args.paths)
        baseline, ours = select(runs, args.baseline), select(runs, args.ours)
        ours = [r for r in ours if r not in baseline]
    elif len(args.paths) == 2:
        baseline, ours = find_runs(args.paths[:1]), find_runs(args.paths[1:])
    else:
        raise ConfigError(
            f"compare got {len(args.paths)} paths without --baseline/--ours: give BASELINE OURS, "
            "or a sweep with --baseline KEY=VALUE --ours KEY=VALUE."
        )
    for name, arm in (("baseline", baseline), ("ours", ours)):
        if not arm:
            raise ConfigError(f"no run matches the {name} arm ({getattr(args, name) or 'path'}).")
        how = (
            f"add the key to --{name}"
            if args.baseline or args.ours
            else "give one cell's runs per path, or a sweep with --baseline/--ours KEY=VALUE"
        )
        require_one_cell(arm, name, how)
    return compare.compare_arms(baseline, ours, rule=args.rule, steady=args.steady)


# accounting ---------------------------------------------------------------------------------


def add_accounting(commands) -> None:
    p = commands.add_parser("accounting", help="Appendix C Eqs. 1-4, Appendix E.1, --recommend")
    p.add_argument(
        "--co", nargs="+", type=Path, default=[], help="the co run (several with --recommend)"
    )
    p.add_argument(
        "--da", nargs="+", type=Path, default=[], help="the da run (several with --recommend)"
    )
    for term in ("o", "a", "f", "dl", "tau"):
        p.add_argument(f"--{term}", type=float, help=f"Eq. 4's {term} (seconds)")
    p.add_argument(
        "--eq2",
        nargs=4,
        type=float,
        metavar=("WEIGHT_BYTES", "BETA", "SAVED_MS", "PENALTY_MS"),
        help="trade-off 1: TP1 -> TP2",
    )
    p.add_argument(
        "--eq3",
        nargs=2,
        type=float,
        metavar=("CENTRAL_S", "PER_HOST_S"),
        help="trade-off 2: admission on one process against per host",
    )
    p.add_argument(
        "--admission",
        nargs="+",
        action="append",
        default=[],
        metavar="STACK ALPHA0 ALPHA1 N",
        help="Eq. 3 for one stack (repeat per stack): its alpha0 (s), alpha1 (s per request) "
        "and the requests each admitting process takes (one count: a single controller)",
    )
    p.add_argument(
        "--lambda-co",
        type=float,
        help="the co step (s): Eq. 4 then predicts the da step and the DA/CO ratio",
    )
    p.add_argument(
        "--out-of-fit",
        nargs="+",
        type=int,
        default=[],
        metavar="CELL",
        help="E.1: cells (0-based) left out of the Delta fit (Figure 8's hollow points)",
    )
    p.add_argument(
        "--decode-premium",
        nargs=3,
        type=float,
        metavar=("CENTRAL_MS", "LOCAL_MS", "ITERATIONS"),
        help="trade-off 3",
    )
    p.add_argument("--ratio-model", action="store_true", help="Appendix E.1 (Eq. 5)")
    p.add_argument("--t-pw", nargs="+", type=float, default=[])
    p.add_argument("--t-loco", nargs="+", type=float, default=[])
    p.add_argument("--recommend", action="store_true", help="predict da at every split from co")
    p.add_argument("--splits", nargs="+", type=float, default=[], help="--recommend's shares")
    _common(p)
    p.set_defaults(run=run_accounting, format=format_accounting)


def _one_run(paths: list[Path], placement: str) -> Run:
    """The one run of `placement` that Eq. 4's terms are measured from (`--co` or `--da`): a
    sweep or a run of the other placement is refused, not read as its first run."""
    runs = find_runs(paths)
    if len(runs) != 1:
        raise ConfigError(
            f"accounting --{placement} takes one run for Eq. 4's terms, and "
            f"{' '.join(map(str, paths))} holds {len(runs)}: pass one run directory, "
            f"e.g. {runs[0].run_dir}."
        )
    if runs[0].placement != placement:
        raise ConfigError(
            f"accounting --{placement} needs a placement={placement} run; "
            f"{runs[0].run_dir} ran placement={runs[0].placement}."
        )
    return runs[0]


def run_accounting(args) -> dict:
    result: dict = {}
    if args.recommend:
        co, da = find_runs(args.co), find_runs(args.da) if args.da else []
        lambda_co, predictions = recommend.predict_splits(
            co, da, dl=args.dl, tau=args.tau or 0.0, steady=args.steady,
            splits=args.splits or (),
        )  # fmt: skip
        result["recommend"] = {
            "lambda_co": lambda_co,
            "predictions": [
                {**dataclasses.asdict(p), "predicted_s": p.predicted_s, "error": p.error}
                for p in predictions
            ],
            "text": recommend.format_recommendation(lambda_co, predictions),
        }
    elif args.co and args.da:
        terms = accounting.eq4_terms_from_runs(
            _one_run(args.co, "co"), _one_run(args.da, "da"), steady=args.steady
        )
        result["eq4_terms"] = dataclasses.asdict(terms)
        result["eq4"] = _eq4(
            terms.hidden_training, terms.a, terms.fragmentation, terms.dl, terms.tau
        )
        result["eq4_periods"] = accounting.eq4_periods_verdict(terms)
    if args.o is not None or args.f is not None:
        missing = [t for t in ("o", "f") if getattr(args, t) is None]
        if missing:
            raise ConfigError(f"Eq. 4 needs --{missing[0]}: O and F are both required.")
        result["eq4"] = _eq4(args.o, args.a or 0.0, args.f, args.dl or 0.0, args.tau or 0.0)
    if args.lambda_co is not None and "eq4" in result:
        lambda_da = args.lambda_co - result["eq4"]["da_saves_s"]
        result["eq4"]["predicted"] = {
            "lambda_co": args.lambda_co,
            "lambda_da": lambda_da,
            "da_over_co": lambda_da / args.lambda_co,
        }
    _tradeoffs(args, result)
    if args.admission:
        result["eq3"] = [_admission(values) for values in args.admission]
    if not result:
        raise ConfigError(
            "accounting needs terms: --co/--da runs, --o/--f, --eq2, --eq3, "
            "--decode-premium, --ratio-model or --recommend."
        )
    return result


def _admission(values: list[str]) -> dict:
    """Eq. 3 for one stack: STACK ALPHA0 ALPHA1 N [N ...] (requests per admitting process)."""
    if len(values) < 4:
        raise ConfigError(
            "--admission needs STACK ALPHA0 ALPHA1 and at least one request count, e.g. "
            "--admission pathways 0.0 0.0005 2048."
        )
    try:
        alpha0, alpha1 = float(values[1]), float(values[2])
        requests = [int(n) for n in values[3:]]
    except ValueError:
        raise ConfigError(
            f"--admission {' '.join(values)}: ALPHA0 and ALPHA1 are seconds, the request "
            "counts whole numbers."
        ) from None
    seconds = accounting.admission_s(alpha0=alpha0, alpha1=alpha1, requests=requests)
    return {
        "stack": values[0],
        "alpha0": alpha0,
        "alpha1": alpha1,
        "requests": requests,
        "admission_s": seconds,
    }


def _eq4(o, a, f, dl, tau) -> dict:
    return {
        "O": o,
        "A": a,
        "F": f,
        "dL": dl,
        "tau": tau,
        **accounting.eq4_verdict(o=o, a=a, f=f, dl=dl, tau=tau),
    }


def _tradeoffs(args, result: dict) -> None:
    if args.eq2:
        weight_bytes, beta, saved_ms, penalty_ms = args.eq2
        bytes_ms = accounting.tp_doubling_saving_ms(weight_bytes=weight_bytes, beta_eff=beta)
        result["tradeoff1"] = {
            "bytes_term_ms": bytes_ms,
            "saved_ms": saved_ms,
            "penalty_ms": penalty_ms,
            "favours": "TP2" if saved_ms > penalty_ms else "TP1",
        }
    if args.eq3:
        central, local = args.eq3
        result["tradeoff2"] = {
            "central_s": central,
            "per_host_s": local,
            "host_local_saves_s": central - local,
        }
    if args.decode_premium:
        central, local, iterations = args.decode_premium
        result["tradeoff3"] = {
            "premium_ms": central - local,
            "per_step_s": (central - local) * iterations / 1e3,
        }
    if args.ratio_model:
        if len(args.t_pw) != len(args.t_loco) or len(args.t_pw) < 3:
            raise ConfigError(
                "--ratio-model needs --t-pw and --t-loco of equal length, >= 3 cells."
            )
        cells = len(args.t_pw)
        if any(not 0 <= i < cells for i in args.out_of_fit):
            raise ConfigError(f"--out-of-fit takes cell numbers 0-{cells - 1}.")
        in_fit = [i not in args.out_of_fit for i in range(cells)]
        result["ratio_model"] = {
            **dataclasses.asdict(accounting.fit_ratio_model(args.t_pw, args.t_loco, in_fit=in_fit)),
            "out_of_fit": list(args.out_of_fit),
        }


def format_accounting(result: dict[str, Any]) -> str:
    lines = [result["recommend"]["text"]] if "recommend" in result else []
    lines += _eq4_lines(result) + _tradeoff_lines(result)
    if "ratio_model" in result:
        lines.append(_ratio_model_line(result["ratio_model"]))
    return "\n".join(lines)


def _eq4_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    if "eq4_terms" in result:
        t = result["eq4_terms"]
        lines.append("Eq. 4 terms (s): " + "  ".join(f"{k} {v:.3f}" for k, v in t.items()))
    if "eq4" in result:
        e, periods = result["eq4"], result.get("eq4_periods", {"shortcut_applies": True})
        lines.append(
            ("Eq. 4" if periods["shortcut_applies"] else "Eq. 4 shortcut (not applicable here)")
            + f": O + A = {e['O + A']:.3f} s against F + dL + tau = {e['F + dL + tau']:.3f} s: "
            f"favours {e['favours']} (da saves {e['da_saves_s']:+.3f} s per step)"
        )
    if "predicted" in result.get("eq4", {}):
        p = result["eq4"]["predicted"]
        lines.append(
            f"predicted: lambda_co {p['lambda_co']:.3f} s, lambda_DA {p['lambda_da']:.3f} s, "
            f"DA/CO {p['da_over_co']:.3f}"
        )
    if "eq4_periods" in result:
        p = result["eq4_periods"]
        lines.append(
            f"Eq. 4 periods: lambda_co {p['lambda_co']:.3f} s, lambda_DA {p['lambda_da']:.3f} s "
            f"(longer da branch: {p['longer_da_branch']}): favours {p['favours']}"
        )
        if not p["shortcut_applies"]:
            lines.append(
                "  (the shortcut O + A > F + dL + tau assumes rollout is the longer da branch; "
                "here training is, so the periods decide)"
            )
    return lines


def _tradeoff_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    if "tradeoff1" in result:
        t = result["tradeoff1"]
        lines.append(
            f"trade-off 1 (Eq. 2): bytes term {t['bytes_term_ms']:.2f} ms, saved "
            f"{t['saved_ms']:.2f} ms against {t['penalty_ms']:.2f} ms: {t['favours']}"
        )
    if "tradeoff2" in result:
        t = result["tradeoff2"]
        lines.append(
            f"trade-off 2 (Eq. 3): host-local admission saves {t['host_local_saves_s']:.2f} s"
        )
    for stack in result.get("eq3", []):
        lines.append(
            f"Eq. 3 ({stack['stack']}): alpha0 {stack['alpha0']:g} s + alpha1 "
            f"{stack['alpha1']:g} s x max {max(stack['requests'])} requests = "
            f"{stack['admission_s']:.3f} s"
        )
    if "tradeoff3" in result:
        t = result["tradeoff3"]
        lines.append(
            f"trade-off 3: premium {t['premium_ms']:.2f} ms/iteration = "
            f"{t['per_step_s']:.2f} s per step"
        )
    return lines


def _ratio_model_line(r: dict[str, Any]) -> str:
    return (
        "E.1 (Eq. 5): Delta "
        + ", ".join(f"{d:.2f}" for d in r["deltas"])
        + "; R from the others' Delta "
        + ", ".join(f"{p:.2f}" for p in r["loo_predictions"])
        + f"; free fit a = {r['slope']:.2f} [{r['slope_low']:.2f}, {r['slope_high']:.2f}]"
        + (
            f"; out of the fit: cells {', '.join(map(str, r['out_of_fit']))}"
            if r["out_of_fit"]
            else ""
        )
    )


# cost ---------------------------------------------------------------------------------------


def add_cost(commands) -> None:
    p = commands.add_parser("cost", help="Appendix I: a cell across seeds, Table I2's variants")
    p.add_argument("runs", nargs="+", type=Path, help="seed runs of one cell (or their sweep)")
    p.add_argument("--against", nargs="+", type=Path, default=[], help="the other cell's seeds")
    p.add_argument("--select", nargs="+", default=[], metavar="KEY=VALUE", help="ours from a sweep")
    p.add_argument("--against-select", nargs="+", default=[], metavar="KEY=VALUE")
    p.add_argument("--target", type=float, help="default: the runs' own eval_target")
    p.add_argument(
        "--quality-at",
        nargs="+",
        type=int,
        default=[],
        metavar="UPDATE",
        help="Table I6: score each seed at these updates (default: the first two eval_at_updates)",
    )
    p.add_argument(
        "--eval-rows",
        type=int,
        help="held-out rows per checkpoint, for Table I6's floor (default: dataset.eval_size)",
    )
    _common(p)
    p.set_defaults(run=run_cost, format=cost.format_cost)


def run_cost(args) -> dict:
    ours = select(find_runs(args.runs), args.select)
    if ours:
        require_one_cell(ours, "ours", "add the key to --select")
    cell = cost.build_cell(ours, target=args.target)
    if not args.against and not args.against_select:
        if args.quality_at:
            raise ConfigError(quality.TWO_CELLS)
        return cost.cell_report(cell)
    against = select(find_runs(args.against or args.runs), args.against_select)
    if against:
        require_one_cell(against, "against", "add the key to --against-select")
    row = cost.compare_cells(cell, cost.build_cell(against, target=cell.target))
    row["quality"] = quality.compare_quality(
        ours, against, updates=args.quality_at, rows=args.eval_rows
    )
    return row


# figures ------------------------------------------------------------------------------------


def add_figures(commands) -> None:
    from locoexp.analysis.figures import Figure  # noqa: PLC0415

    p = commands.add_parser("figures", help="the paper's figures as PNG files")
    p.add_argument("paths", nargs="+", type=Path, help="run or sweep directories")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", nargs="+", choices=[f.value for f in Figure], default=None)
    p.add_argument("--target", type=float, help="cost panel target (default: each run's own)")
    p.add_argument("--steady", metavar="FIRST:LAST")
    p.set_defaults(run=run_figures, format=lambda result: "\n".join(result["written"]))


def run_figures(args) -> dict:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from locoexp.analysis.figures import Figure, draw  # noqa: PLC0415

    plt.switch_backend("Agg")  # files only: no display on servers and in CI
    runs = find_runs(args.paths)
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = [Figure(f) for f in args.only] if args.only else list(Figure)
    written = [
        str(draw(f, runs, out=args.out, target=args.target, steady=args.steady)) for f in wanted
    ]
    return {"written": written}
