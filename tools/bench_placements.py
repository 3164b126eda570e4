"""co vs single_controller on local hosts, and the effect of each of O1-O4 (issue [4 of 7]).

Runs the real platform (`locoexp.main.run`: real host processes, real GSM8K rows, the real Qwen3
tokenizer, a small Qwen3-vocabulary model, short caps: a GSM8K-shaped workload scaled to a CPU),
arms interleaved launch by launch, and prints per arm the median steady step time, the
single-controller/co ratio per step and per token with a 95% bootstrap interval and the paper's
verdict rule (Appendix A), the single controller's admission time against the slowest co host's,
and seconds per decode iteration. Then each of O1-O4 switched off alone against `opt=optimized`.

    python tools/bench_placements.py [--hosts 2 4] [--launches 2] [--steps 8] [--json out.json]

These are CPU figures from processes sharing this machine's cores; they are not TPU figures.
"""

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from locoexp.analysis.compare import bootstrap_ratio, equal_work, verdict
from locoexp.compose import compose_config
from locoexp.main import run
from locoexp.metrics.run_records import read_metrics_jsonl
from locoexp.metrics.steady import steady_records, steady_window

WORKLOAD = ["+experiment=bench_placements"]  # experiments/experiment/bench_placements.yaml
LEVERS = {
    "O1": "opt.metrics_off_barrier",
    "O2": "opt.freeze_gc",
    "O3": "opt.balance_prompts",
    "O4": "opt.publish_in_one_call",
}


def launch(overrides: list[str], steps: int, *, profile: bool = False) -> list[dict]:
    """One launch of `python run.py <overrides> steps=<steps>`; its steady step records
    (`locoexp.metrics.steady`, as the run's summary and the analysis pick them). With
    `profile`, one more step is run and profiled (its record carries `breakdown/*` and is left
    out of the step-time statistics: tracing slows the step it watches)."""
    extra = [f"steps={steps + 1}", f"profile_steps=[{steps}]"] if profile else [f"steps={steps}"]
    with tempfile.TemporaryDirectory() as folder:
        config = compose_config([*overrides, *extra])
        run(config, run_dir=folder, progress=False)
        records = read_metrics_jsonl(Path(folder) / "metrics.jsonl")
    d = config.dataset
    window = steady_window(steps=config.steps, batches_per_pass=d.batches_per_pass, passes=d.passes)
    return steady_records(records, window)


def breakdown(records: list[dict]) -> dict[str, float]:
    """Mean `breakdown/*` shares over the profiled steps of `records`."""
    profiled = [r for r in records if "breakdown/host_share" in r]
    keys = ("compute", "network", "host")
    return {k: float(np.mean([r[f"breakdown/{k}_share"] for r in profiled])) for k in keys}


def tokens(record: dict) -> float:
    return record["rollout/tokens_in"] + record["rollout/tokens_out"]


def compare_placements(hosts: int, launches: int, steps: int) -> dict:
    arms = {"co": [], "single_controller": []}
    profiled = {arm: [] for arm in arms}
    for _ in range(launches):
        for arm in arms:
            records = launch(
                [*WORKLOAD, f"placement={arm}", f"hardware.hosts={hosts}"], steps, profile=True
            )
            arms[arm] += [r for r in records if "breakdown/host_share" not in r]
            profiled[arm] += [r for r in records if "breakdown/host_share" in r]
    co, sc = arms["co"], arms["single_controller"]
    per_step = bootstrap_ratio([r["timing/step_s"] for r in sc], [r["timing/step_s"] for r in co])
    per_token = bootstrap_ratio(
        [r["timing/step_s"] / tokens(r) for r in sc], [r["timing/step_s"] / tokens(r) for r in co]
    )
    phases = (
        "admission",
        "head_interval",
        "generation",
        "reward",
        "pack",
        "train",
        "publish",
        "log",
        "host_orchestration",
    )
    return {
        "phases_s": {
            arm: {
                p: float(np.median([r.get(f"timing/{p}_s", 0.0) for r in records])) for p in phases
            }
            for arm, records in arms.items()
        },
        "breakdown": {arm: breakdown(records) for arm, records in profiled.items()},
        "hosts": hosts,
        "co_step_s": float(np.median([r["timing/step_s"] for r in co])),
        "single_controller_step_s": float(np.median([r["timing/step_s"] for r in sc])),
        "ratio_per_step": vars(per_step),
        "ratio_per_token": vars(per_token),
        "verdict": verdict(per_step, per_token, equal_work(sc, co)),
        "admission_single_controller_s": float(np.median([r["timing/admission_s"] for r in sc])),
        "admission_slowest_co_host_s": float(np.median([r["timing/admission_s"] for r in co])),
        "decode_ms_per_iteration_co": float(
            np.median([r["rollout/decode_ms_per_iteration"] for r in co])
        ),
        "decode_ms_per_iteration_single_controller": float(
            np.median([r["rollout/decode_ms_per_iteration"] for r in sc])
        ),
    }


def lever_effects(hosts: int, launches: int, steps: int) -> dict:
    arms = {"optimized": ["opt=optimized"]}
    arms.update({f"{name} off": ["opt=optimized", f"{key}=false"] for name, key in LEVERS.items()})
    times = {arm: [] for arm in arms}
    for _ in range(launches):
        for arm, overrides in arms.items():
            times[arm] += [
                r["timing/step_s"]
                for r in launch([*WORKLOAD, *overrides, f"hardware.hosts={hosts}"], steps)
            ]
    base = times["optimized"]
    return {
        arm: {"step_s": float(np.median(t)), "off_over_on": vars(bootstrap_ratio(t, base))}
        for arm, t in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--launches", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lever-hosts", type=int, default=2)
    parser.add_argument("--no-levers", action="store_true", help="skip the O1-O4 ablation")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {"placements": [], "levers": None}
    for hosts in args.hosts:
        result = compare_placements(hosts, args.launches, args.steps)
        results["placements"].append(result)
        r, t = result["ratio_per_step"], result["ratio_per_token"]
        print(
            f"[CPU, {hosts} local hosts] co {result['co_step_s']:.3f} s/step, single_controller "
            f"{result['single_controller_step_s']:.3f} s/step; ratio sc/co {r['value']:.3f} "
            f"[{r['low']:.3f}, {r['high']:.3f}] per step, {t['value']:.3f} [{t['low']:.3f}, "
            f"{t['high']:.3f}] per token -> {result['verdict']}",
            flush=True,
        )
        print(
            "  admission: single controller "
            f"{1e3 * result['admission_single_controller_s']:.2f} ms, "
            f"slowest co host {1e3 * result['admission_slowest_co_host_s']:.2f} ms; decode "
            f"{result['decode_ms_per_iteration_single_controller']:.2f} vs "
            f"{result['decode_ms_per_iteration_co']:.2f} ms per decode iteration (sc vs co)",
            flush=True,
        )
        for arm, phases in result["phases_s"].items():
            shown = ", ".join(f"{name} {seconds:.3f}" for name, seconds in phases.items())
            print(f"  {arm} phases (s, median; co: slowest host): {shown}", flush=True)
        for arm, shares in result["breakdown"].items():
            shown = ", ".join(f"{name} {share:.3f}" for name, share in shares.items())
            print(f"  {arm} profiled-step breakdown (co: host mean): {shown}", flush=True)
    if args.no_levers:
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return
    results["levers"] = lever_effects(args.lever_hosts, args.launches, args.steps)
    for arm, row in results["levers"].items():
        ratio = row["off_over_on"]
        print(
            f"[CPU, {args.lever_hosts} hosts, co] {arm:>9}: {row['step_s']:.3f} s/step; "
            "vs optimized "
            f"{ratio['value']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
