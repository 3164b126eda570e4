"""co vs da at every valid split on local hosts, for a decode-heavy and a prefill-heavy workload
scaled to this CPU, with the terms of Appendix C's Eq. 4 (issue [5 of 7]).

    lambda_DA = max{DR(Hr) + dL, DT(Ht) + dpub} - A + tau,   lambda_co = DR(H) + DT(H) + dpub
    DA wins iff O + A > F + dL + tau,   F = DR(Hr) - DR(H),   O = DT(H) + dpub(co)

Measured (medians over steady steps, slowest host per side): lambda_co and lambda_DA (step
times), DR(H) = admission + generation + reward under co, DT(H) = pack + train under co,
dpub(co); DR(Hr) = admission + generation + reward of a da rollout host, dL (its weight load),
DT(Ht) = transfer + pack + train of the da trainer, dpub (gather + object-store put), and the
overlap share. Derived: F, O, and tau = lambda_DA - max{...} (a residual: Ray dispatch and
whatever is unmeasured). A is the da run's `timing/straggler_absorbed_s`: its rollout hosts run
at their own pace within the staleness bound; with no injected delay it is near 0 here
(`+experiment=straggler_cpu` measures it under a slowed host).

    python tools/bench_co_vs_da.py [--hosts 4] [--steps 6] [--workloads decode prefill]

CPU figures from processes sharing this machine's cores; they are not TPU figures.
"""

import argparse
import json
from pathlib import Path

import numpy as np
from bench_placements import launch  # this folder (a script's folder is on its path)

from locoexp.analysis.accounting import eq4_terms_from_steps, eq4_verdict
from locoexp.layout import trainer_hosts, valid_splits

# experiments/experiment/bench_co_vs_da_<name>.yaml: decode-heavy (short prompts, 48 forced
# output tokens: rollout is most of the step) and prefill-heavy (GSM8K prompts, 4 output tokens:
# training the long packed rows and the 152k-token head is most of the step)
WORKLOADS = ("decode", "prefill")


def eq4_terms(co: list[dict], da: list[dict]) -> dict[str, float]:
    """The terms of `locoexp.analysis.accounting` (one definition) with the measured periods."""
    t = eq4_terms_from_steps(co, da)
    step_s = {
        name: float(np.median([r["timing/step_s"] for r in x]))
        for name, x in (("co", co), ("da", da))
    }
    return {
        "lambda_co": step_s["co"],
        "DR(H)": t.dr_h,
        "DT(H)": t.dt_h,
        "dpub_co": t.dpub_co,
        "lambda_DA": step_s["da"],
        "DR(Hr)": t.dr_hr,
        "dL": t.dl,
        "DT(Ht)": t.dt_ht,
        "dpub": t.dpub,
        "overlap_share": float(np.median([r["timing/overlap_share"] for r in da])),
        "A": t.a,
        "tau": t.tau,
        "F": t.fragmentation,
        "O": t.hidden_training,
        "da_over_co": step_s["da"] / step_s["co"],
    }


def bench(workload: str, hosts: int, steps: int) -> dict:
    base = [f"+experiment=bench_co_vs_da_{workload}", f"hardware.hosts={hosts}"]
    co = launch(base + ["placement=co"], steps)
    result = {"workload": workload, "hosts": hosts, "splits": {}}
    for split in valid_splits(hosts):
        da = launch(base + ["placement=da", f"split={split}"], steps)
        result["splits"][split] = eq4_terms(co, da)
    return result


def show(result: dict) -> None:
    hosts = result["hosts"]
    for split, t in result["splits"].items():
        ht = trainer_hosts(split, hosts)
        print(
            f"[CPU, {result['workload']}-heavy, {hosts} local hosts] co {t['lambda_co']:.3f} s/step"
            f" | da split={split} ({ht} trainer / {hosts - ht} rollout) {t['lambda_DA']:.3f} s/step"
            f" (da/co {t['da_over_co']:.2f}x)",
            flush=True,
        )
        print(
            "  measured: "
            f"DR(H) {t['DR(H)']:.3f}  DT(H) {t['DT(H)']:.3f}  dpub(co) {t['dpub_co']:.3f}  "
            f"DR(Hr) {t['DR(Hr)']:.3f}  dL {t['dL']:.3f}  DT(Ht) {t['DT(Ht)']:.3f}  "
            f"dpub {t['dpub']:.3f}  overlap share {t['overlap_share']:.2f}",
            flush=True,
        )
        wins = eq4_verdict(o=t["O"], a=t["A"], f=t["F"], dl=t["dL"], tau=t["tau"])["favours"]
        print(
            f"  derived:  F {t['F']:.3f}  O {t['O']:.3f}  A {t['A']:.3f} (absorbed wait)  "
            f"tau {t['tau']:.3f} (residual)  ->  O + A > F + dL + tau favours {wins}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    for workload in args.workloads:
        results.append(bench(workload, args.hosts, args.steps))
        show(results[-1])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
