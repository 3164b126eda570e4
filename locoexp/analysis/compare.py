"""Comparing two arms by the paper's protocol (Section 3.3, Appendix A).

Step time is the median over steady steps (`runs.steady_window`). Launches of an arm are pooled
for the pooled ratio and also compared one by one against the pooled baseline. Three rules:

- stacks (Pathways-style single controller against LoCoJAX): S = T_baseline / T_ours per step
  and per processed token, 95% percentile bootstrap over steady steps (10,000 resamples,
  `scipy.stats.bootstrap`); "ours faster" needs both lower bounds above 1.111 in every per-launch
  comparison, equal work and three launches per arm (fewer: provisional).
- within LoCoJAX (DA against CO): the 95% Welch interval on log launch values (the ratio is the
  geometric mean over launches), and the paired-step bootstrap (step i of launch k of one arm
  against the same step and launch of the other), which must fall on the same side of 1.
- ablation rungs (a lever off against on): disjoint launch ranges and a ratio that differs from 1
  by more than either arm's relative spread.
Every rule's verdict is provisional with fewer than three launches per arm (Appendix A). Beside
the verdict: DA against CO reports Section 4.4's pre-registered training-reward band (0.005), and
where scored steps recompile, the ratio with the recorded compile seconds charged back.

Equal work (Section 3.3): per-step mean prompt lengths within 0.5 tokens on every step, mean and
longest output lengths within a factor [0.8, 1.25], truncation shares within 10 points.
This module reads records, never imports jax.
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from locoexp.analysis.runs import (
    STEP_TIME,
    Run,
    processed_tokens,
    steady_steps,
    steady_window,
)
from locoexp.metrics.compiles import compile_seconds

VERDICT_MARGIN = 1.111  # covers the ~10% shift a Pathways head node can cause (Section 3.3)
LAUNCHES_FOR_A_VERDICT = 3  # Appendix A: fewer launches per arm make a cell provisional
RESAMPLES = 10_000
# Appendix A: the paired-step bootstrap joins the Welch interval only on these workloads
PAIRED_WORKLOADS = ("numinamath_cot", "swe_agent")
# Section 4.4: DA's training reward stays within this pre-registered band of CO's
REWARD_BAND = 0.005
REWARD_KEY = "rollout/reward_mean"


@dataclasses.dataclass(frozen=True)
class Ratio:
    value: float  # baseline / ours (> 1: ours faster)
    low: float
    high: float


def _median_ratio(a, b, axis=-1):
    return np.median(a, axis=axis) / np.median(b, axis=axis)


def bootstrap_ratio(
    baseline: Sequence[float], ours: Sequence[float], *, resamples: int = RESAMPLES, seed: int = 0
) -> Ratio:
    """median(baseline) / median(ours), 95% percentile bootstrap resampling each arm's steps."""
    a, b = np.asarray(baseline, float), np.asarray(ours, float)
    result = stats.bootstrap(
        (a, b),
        _median_ratio,
        n_resamples=resamples,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    ci = result.confidence_interval
    return Ratio(float(np.median(a) / np.median(b)), float(ci.low), float(ci.high))


def paired_ratio(
    baseline: Sequence[float], ours: Sequence[float], *, resamples: int = RESAMPLES, seed: int = 0
) -> Ratio:
    """Paired-step bootstrap: step pairs (same batch) resampled together (Appendix A)."""
    a, b = np.asarray(baseline, float), np.asarray(ours, float)
    result = stats.bootstrap(
        (a, b),
        _median_ratio,
        n_resamples=resamples,
        method="percentile",
        paired=True,
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    ci = result.confidence_interval
    return Ratio(float(np.median(a) / np.median(b)), float(ci.low), float(ci.high))


def welch_log_ratio(baseline: Sequence[float], ours: Sequence[float]) -> Ratio | None:
    """Geometric-mean ratio of launch values with the 95% Welch interval on their logs;
    None with fewer than two launches on either side (no variance to estimate)."""
    a, b = np.log(np.asarray(baseline, float)), np.log(np.asarray(ours, float))
    value = float(np.exp(a.mean() - b.mean()))
    if a.size < 2 or b.size < 2:
        return None
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    return Ratio(value, float(np.exp(ci.low)), float(np.exp(ci.high)))


def equal_work(baseline: Sequence[dict], ours: Sequence[dict]) -> list[str]:
    """Section 3.3's equal-work checks on all step records of one launch of each arm (paired by
    step); returns the violations (empty: equal work)."""
    problems = []
    by_step = {r["step"]: r for r in ours}
    for a in baseline:
        b = by_step.get(a["step"])
        if b is None:
            continue
        gap = abs(a["rollout/prompt_tokens_mean"] - b["rollout/prompt_tokens_mean"])
        if gap > 0.5:
            problems.append(f"step {a['step']}: mean prompt length differs by {gap:.2f} tokens")
    for key in ("rollout/completion_tokens_mean", "rollout/completion_tokens_max"):
        reduce = np.max if key.endswith("_max") else np.mean
        ratio = reduce([r[key] for r in baseline]) / max(reduce([r[key] for r in ours]), 1e-9)
        if not 0.8 <= ratio <= 1.25:
            problems.append(f"{key} ratio {ratio:.2f} outside [0.8, 1.25]")
    share = abs(
        np.mean([r["rollout/truncated_share"] for r in baseline])
        - np.mean([r["rollout/truncated_share"] for r in ours])
    )
    if share > 0.10:
        problems.append(f"truncation shares differ by {100 * share:.0f} points")
    return problems


def verdict(per_step: Ratio, per_token: Ratio, problems: list[str]) -> str:
    """The stacks rule on one comparison (Section 3.3)."""
    if problems:
        return "not comparable: " + "; ".join(problems)
    if per_step.low > VERDICT_MARGIN and per_token.low > VERDICT_MARGIN:
        return f"ours faster (both lower bounds above {VERDICT_MARGIN})"
    return f"no verdict (a lower bound is at or below {VERDICT_MARGIN})"


def rung_verdict(baseline_launches: Sequence[float], ours_launches: Sequence[float]) -> str:
    """Appendix A's ablation rung: disjoint launch ranges and |ratio - 1| above both spreads;
    provisional with fewer than three launches per arm, like every other verdict."""
    a, b = np.asarray(baseline_launches, float), np.asarray(ours_launches, float)
    if a.size < 2 or b.size < 2:
        return "no verdict (a rung needs at least two launches per arm)"
    ratio = math.exp(np.log(a).mean() - np.log(b).mean())
    spread = max((a.max() - a.min()) / np.median(a), (b.max() - b.min()) / np.median(b))
    disjoint = a.min() > b.max() or b.min() > a.max()
    if not (disjoint and abs(ratio - 1) > spread):
        return "no verdict (launch ranges overlap or the ratio is within the spread)"
    winner = "ours" if ratio > 1 else "baseline"
    return _provisional(winner, min(a.size, b.size)) or f"{winner} faster (rung holds)"


def _provisional(winner: str, fewest: int) -> str | None:
    """Appendix A: fewer than three launches per arm make any verdict provisional."""
    if fewest >= LAUNCHES_FOR_A_VERDICT:
        return None
    return f"{winner} faster, provisional ({fewest} launches per arm; Appendix A asks 3)"


def step_times(run: Run, steady: str | None) -> list[float]:
    return [float(r[STEP_TIME]) for r in steady_steps(run, override=steady)]


def token_times(run: Run, steady: str | None) -> list[float]:
    return [float(r[STEP_TIME]) / processed_tokens(r) for r in steady_steps(run, override=steady)]


class Rule:
    """Which of Appendix A's rules decides a pair of arms."""

    stacks = "stacks"  # single controller against LoCoJAX: 1.111 margin on both bootstraps
    within = "within"  # DA against CO: Welch on log launch values, paired-step bootstrap
    rung = "rung"  # a lever's ablation rung

    @staticmethod
    def infer(baseline: Sequence[Run], ours: Sequence[Run]) -> str:
        kinds = {r.placement for r in (*baseline, *ours)}
        if "single_controller" in kinds:
            return Rule.stacks
        if "da" in kinds:
            return Rule.within
        return Rule.rung


def compare_arms(
    baseline: Sequence[Run], ours: Sequence[Run], *, rule: str | None = None, steady=None
) -> dict:
    """Appendix A on two arms (each a list of launches): a JSON-ready dict."""
    rule = rule or Rule.infer(baseline, ours)
    pooled_a = [t for r in baseline for t in step_times(r, steady)]
    pooled_b = [t for r in ours for t in step_times(r, steady)]
    if not pooled_a or not pooled_b:
        empty = "baseline" if not pooled_a else "ours"
        raise ValueError(f"the {empty} arm has no steady step with {STEP_TIME}.")
    tokens_a = [t for r in baseline for t in token_times(r, steady)]
    result: dict[str, Any] = {
        "rule": rule,
        "baseline": _arm_summary(baseline, steady),
        "ours": _arm_summary(ours, steady),
        "pooled": {
            "per_step": dataclasses.asdict(bootstrap_ratio(pooled_a, pooled_b)),
            "per_token": dataclasses.asdict(
                bootstrap_ratio(tokens_a, [t for r in ours for t in token_times(r, steady)])
            ),
        },
        "launches": [],
    }
    for run in ours:  # Appendix A: each launch of ours against the pooled baseline
        per_step = bootstrap_ratio(pooled_a, step_times(run, steady))
        per_token = bootstrap_ratio(tokens_a, token_times(run, steady))
        problems = [p for b in baseline for p in equal_work(b.steps, run.steps)]
        result["launches"].append(
            {
                "run": str(run.run_dir),
                "per_step": dataclasses.asdict(per_step),
                "per_token": dataclasses.asdict(per_token),
                "equal_work": sorted(set(problems)),
                "verdict": verdict(per_step, per_token, sorted(set(problems))),
            }
        )
    launch_a = [float(np.median(step_times(r, steady))) for r in baseline]
    launch_b = [float(np.median(step_times(r, steady))) for r in ours]
    result["headline"] = headline_ratio(launch_a, launch_b)
    result["compile_charged"] = compile_charged_ratio(baseline, ours, steady)
    result["compiles_recorded"] = compiles_recorded((*baseline, *ours), steady)
    if rule == Rule.within:
        result["reward_band"] = reward_band(baseline, ours, steady)
    result["workload"] = ours[0].workload
    welch = welch_log_ratio(launch_a, launch_b)
    result["welch"] = None if welch is None else dataclasses.asdict(welch)
    result["paired"] = _paired(baseline, ours, steady)
    result["verdict"] = _decide(result, rule, launch_a, launch_b)
    return result


def _arm_summary(runs: Sequence[Run], steady) -> dict:
    window = steady_window(runs[0], override=steady)
    return {
        "label": runs[0].label,
        "launches": len(runs),
        "runs": [str(r.run_dir) for r in runs],
        "steady_steps": f"{window.first}-{window.last} ({window.rule})",
        "launch_medians_s": [float(np.median(step_times(r, steady))) for r in runs],
    }


def _paired(baseline: Sequence[Run], ours: Sequence[Run], steady) -> dict | None:
    """Launch k of one arm against launch k of the other, step by step (same batches)."""
    a, b = [], []
    for run_a, run_b in zip(baseline, ours, strict=False):
        times_b = {r["step"]: r[STEP_TIME] for r in steady_steps(run_b, override=steady)}
        for r in steady_steps(run_a, override=steady):
            if r["step"] in times_b:
                a.append(r[STEP_TIME])
                b.append(times_b[r["step"]])
    return dataclasses.asdict(paired_ratio(a, b)) if len(a) >= 2 else None


def _decide(result: dict, rule: str, launch_a: list[float], launch_b: list[float]) -> str:
    if rule == Rule.rung:
        return rung_verdict(launch_a, launch_b)
    if rule == Rule.within:
        return _within_verdict(result, fewest=min(len(launch_a), len(launch_b)))
    verdicts = [launch["verdict"] for launch in result["launches"]]
    if any(v.startswith("not comparable") for v in verdicts):
        return next(v for v in verdicts if v.startswith("not comparable"))
    if not all(v.startswith("ours faster") for v in verdicts):
        return f"no verdict (a launch's lower bound is at or below {VERDICT_MARGIN})"
    fewest = min(result["baseline"]["launches"], result["ours"]["launches"])
    return _provisional("ours", fewest) or (
        f"ours faster (every lower bound above {VERDICT_MARGIN}, equal work)"
    )


def _within_verdict(result: dict, *, fewest: int) -> str:
    """Appendix A, DA against CO: the 95% Welch interval on log launch values decides; on
    NuminaMath and SWE the paired-step bootstrap must also fall on the same side of 1 (on GSM8K
    the Welch interval alone); fewer than three launches per arm make the verdict provisional."""
    welch, paired = result["welch"], result["paired"]
    if welch is None:
        return "no verdict (the Welch interval needs two launches per arm)"
    sides = {_side(welch)}
    if result["workload"] in PAIRED_WORKLOADS:
        if paired is None:
            return "no verdict (the paired-step bootstrap needs steps both arms ran)"
        sides.add(_side(paired))
    rules = "Welch and paired agree" if result["workload"] in PAIRED_WORKLOADS else "Welch"
    if len(sides) != 1 or 0 in sides:
        return "no verdict (an interval includes 1 or the two disagree)"
    winner = "ours" if sides == {1} else "baseline"
    return _provisional(winner, fewest) or f"{winner} faster ({rules})"


def compile_charged_ratio(baseline: Sequence[Run], ours: Sequence[Run], steady) -> dict | None:
    """Appendix A: "where scored steps recompile, we also report the ratio with compile time
    charged back", from the compile events the runs recorded (`metrics.compiles`), never from
    how slow a step looks. A launch's charged time is the median over its scored steps of each
    step less its compile seconds, plus the scored steps' compile seconds spread over them:
    exactly the recorded seconds on the headline's basis. None when no scored step compiled, or
    when a launch records no compile events (a run from before they were recorded)."""
    launches = [_scored_compiles(r, steady) for r in (*baseline, *ours)]
    if any(c is None for c in launches):
        return None
    recorded = [c for c in launches if c is not None]
    if not any(sum(seconds) > 0 for _, seconds in recorded):
        return None
    charged = [
        float(np.median(np.subtract(times, seconds))) + sum(seconds) / len(times)
        for times, seconds in recorded
    ]
    split = len(baseline)
    return {
        **headline_ratio(charged[:split], charged[split:]),
        "compile_s": {
            "baseline": float(sum(sum(s) for _, s in recorded[:split])),
            "ours": float(sum(sum(s) for _, s in recorded[split:])),
        },
        "compiling_steps": sum(sum(x > 0 for x in s) for _, s in recorded),
    }


def _scored_compiles(run: Run, steady) -> tuple[list[float], list[float]] | None:
    """A launch's scored step times and the compile seconds each recorded; None when a scored
    step carries no compile record."""
    records = steady_steps(run, override=steady)
    seconds = [compile_seconds(r) for r in records]
    if not records or any(s is None for s in seconds):
        return None
    return [float(r[STEP_TIME]) for r in records], [float(s or 0.0) for s in seconds]


def compiles_recorded(runs: Sequence[Run], steady) -> bool:
    """Whether every launch records compile events on its scored steps."""
    return all(_scored_compiles(r, steady) is not None for r in runs)


def reward_band(baseline: Sequence[Run], ours: Sequence[Run], steady) -> dict:
    """Section 4.4's pre-registered check for DA against CO: training reward (each launch's mean
    `rollout/reward_mean` over its scored steps, averaged over launches) within 0.005 of the
    other arm's. A timing verdict is read at equal quality only inside the band."""
    means = {}
    for name, arm in (("baseline", baseline), ("ours", ours)):
        launches = []
        for run in arm:
            scored = steady_steps(run, override=steady)
            if not scored or any(r.get(REWARD_KEY) is None for r in scored):
                missing = f"{run.run_dir} logs no {REWARD_KEY} on a scored step"
                return {"verdict": f"training reward band not judged: {missing}"}
            launches.append(float(np.mean([float(r[REWARD_KEY]) for r in scored])))
        means[name] = float(np.mean(launches))
    gap = means["ours"] - means["baseline"]
    within = abs(gap) <= REWARD_BAND
    where = "within" if within else "outside"
    return {
        **means,
        "gap": gap,
        "band": REWARD_BAND,
        "within": within,
        "verdict": f"training reward {where} the pre-registered {REWARD_BAND} band "
        f"(ours - baseline {gap:+.4f}; Section 4.4)",
    }


def headline_ratio(launch_a: Sequence[float], launch_b: Sequence[float]) -> dict:
    """Appendix A's headline: each cell averages its launches (the mean of launch medians) and
    the ratio is the geometric mean over launches, baseline over ours."""
    log_ratio = np.mean(np.log(launch_a)) - np.mean(np.log(launch_b))
    return {
        "baseline_s": float(np.mean(launch_a)),
        "ours_s": float(np.mean(launch_b)),
        "ratio": float(np.exp(log_ratio)),
    }


def _side(ratio: dict) -> int:
    return 1 if ratio["low"] > 1 else -1 if ratio["high"] < 1 else 0


def format_comparison(result: dict) -> str:
    """The table a person reads."""
    a, b = result["baseline"], result["ours"]
    lines = [
        f"rule: {result['rule']} (Appendix A)",
        f"baseline: {a['label']}, {a['launches']} launch(es), steady steps {a['steady_steps']},"
        f" launch medians {', '.join(f'{t:.3f}' for t in a['launch_medians_s'])} s",
        f"ours:     {b['label']}, {b['launches']} launch(es), steady steps {b['steady_steps']},"
        f" launch medians {', '.join(f'{t:.3f}' for t in b['launch_medians_s'])} s",
        "",
        f"{'comparison':<28}{'per step [95%]':>26}{'per token [95%]':>26}",
        _row("pooled launches", result["pooled"]["per_step"], result["pooled"]["per_token"]),
    ]
    for i, launch in enumerate(result["launches"]):
        lines.append(_row(f"ours launch {i} vs pooled", launch["per_step"], launch["per_token"]))
        for problem in launch["equal_work"]:
            lines.append(f"  equal work: {problem}")
    for name in ("welch", "paired"):
        if result[name] is not None:
            lines.append(_row(f"{name} (log launches)" if name == "welch" else name, result[name]))
    lines += _compile_lines(result)
    h = result["headline"]
    lines += [
        f"headline (App. A: launches averaged, geometric-mean ratio): baseline "
        f"{h['baseline_s']:.3f} s, ours {h['ours_s']:.3f} s, ratio {h['ratio']:.3f}",
        "",
        f"verdict: {result['verdict']}",
    ]
    if "reward_band" in result:
        lines.append(result["reward_band"]["verdict"])
    return "\n".join(lines)


def _compile_lines(result: dict) -> list[str]:
    charged = result["compile_charged"]
    if not result["compiles_recorded"]:
        return ["compile time: not recorded by these runs (no timing/compile_s), none charged back"]
    if charged is None:
        return []
    return [
        f"with compile time charged back ({charged['compiling_steps']} scored steps compiled: "
        f"baseline {charged['compile_s']['baseline']:.3f} s, ours "
        f"{charged['compile_s']['ours']:.3f} s): ratio {charged['ratio']:.3f}"
    ]


def _row(name: str, per_step: dict, per_token: dict | None = None) -> str:
    def cell(r):
        return f"{r['value']:.3f}x [{r['low']:.3f}, {r['high']:.3f}]"

    return f"{name:<28}{cell(per_step):>26}{cell(per_token) if per_token else '':>26}"
