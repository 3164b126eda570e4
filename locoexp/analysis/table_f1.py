"""Table F1 predicted: each colocated cell's step and, under `da`, Eq. 4's period at every split
the paper ran, from the cell's compiled decode iteration (issue 41 item 2, App. C Eq. 4).

    lambda_DA = max{D_R(H_r) + d_L, D_T(H_t) + d_pub} - A + tau                       (Eq. 4)

- D_R(H_r): the step model's rollout (Eq. 3's admission, the per-request host work, prefill,
  decode; step.py) with the step's requests spread over the H_r rollout hosts' replicas
  (`da_shape`), plus the per-step host time (constants.HOST_S: each host's own loop pays it,
  trainer or rollout);
- D_T(H_t): the step model's training on the H_t trainer hosts' cores, plus the host time;
- d_L, tau: App. C's prior (0.49 s) and residual (0.03 s) at GSM8K 128 chips (constants.py);
- A: a host-level straggler (`straggler_a`): each rollout host's finish jitters by a normal
  spread of constants.STRAGGLER_S seconds, so the slowest of H_r leads the mean by
  STRAGGLER_S x E[max of H_r standard normals]; staleness absorbs that lead under da. Lengths
  alone give A < 0.1 s (LOG, session 28) against App. C's 0.58 s: the straggler is a host's.
  A comes off the rollout branch only (Eq4Terms.lambda_da_rollout_absorbs): App. C's Eq. 4
  subtracts it from the longer branch, taking rollout to be that one.
The co column is step.py's lambda_co (the optimized arm predicted as the base arm). Every
cell but the fit sets' (constants.py) is held out; no per-cell factor. Never imports jax.
"""

import dataclasses
import functools
import math

from scipy import integrate, stats

from locoexp.analysis import step
from locoexp.analysis.accounting import Eq4Terms
from locoexp.analysis.constants import D_L_S, STRAGGLER_S, TAU_S
from locoexp.analysis.predict import (
    DecodeFigures,
    cell_shape,
    decode_figures,
    read_length_mix,
    replica_rows,
)
from locoexp.compose import cell_of, compose_configs, sweep_jobs

# Table F1 (s): (workload, chips) -> {"co": step, trainer share: step}; missing splits not run
TABLE_F1: dict[tuple[str, int], dict[str | float, float]] = {
    ("gsm8k", 8): {"co": 5.08, 0.5: 8.20},
    ("gsm8k", 16): {"co": 3.33, 0.5: 4.32, 0.25: 3.75},
    ("gsm8k", 32): {"co": 2.38, 0.5: 2.87, 0.25: 2.63},
    ("gsm8k", 64): {"co": 2.02, 0.5: 1.98, 0.25: 1.94, 0.125: 2.56},
    ("gsm8k", 128): {"co": 1.73, 0.5: 1.88, 0.25: 1.56, 0.125: 2.90},
    ("gsm8k", 256): {"co": 1.77, 0.5: 1.80, 0.25: 1.62, 0.125: 2.22},
    ("numinamath_cot", 16): {"co": 89.4},
    ("numinamath_cot", 32): {"co": 44.5, 0.5: 56.1, 0.25: 42.0},
    ("numinamath_cot", 64): {"co": 27.9, 0.5: 34.1, 0.25: 26.5, 0.125: 25.1},
    ("numinamath_cot", 128): {"co": 19.6, 0.5: 21.4, 0.25: 17.0, 0.125: 16.8},
    ("numinamath_cot", 256): {"co": 14.3, 0.5: 14.8, 0.25: 12.1, 0.125: 11.8},
    ("swe_agent", 32): {"co": 31.1, 0.5: 40.4},
    ("swe_agent", 64): {"co": 16.8, 0.5: 20.9, 0.25: 40.2},
    ("swe_agent", 128): {"co": 10.0, 0.5: 11.8, 0.25: 21.0, 0.125: 40.6},
    ("swe_agent", 256): {"co": 6.3, 0.5: 7.2, 0.25: 11.8, 0.125: 21.5},
}
# the one F1 figure in a fit set (constants.MFU's): its trainer branch, 4 of 32 hosts, is the
# longest of Table F1's and pins the trainer's FLOP rate
FIT_CELL = ("swe_agent", 128, 0.125)
# App. C trade-off 4's GSM8K 8-chip fragmentation, F = D_R(1 host) - D_R(2 hosts), in the same
# fit (constants.REQUEST_S's figure); its O = 1.1 s there and the 128-chip terms are held out
F_CELL, F_PAPER_S = ("gsm8k", 8, 0.5), 2.9
FIT_CELLS = (FIT_CELL, F_CELL)
ROLLOUT = ("admission", "requests", "prefill", "decode")  # step.predict_step's rollout phases


@functools.cache
def expected_max(n: int) -> float:
    """E[max of n independent standard normals] (0 for one host)."""
    if n <= 1:
        return 0.0
    density = lambda x: x * n * stats.norm.pdf(x) * stats.norm.cdf(x) ** (n - 1)  # noqa: E731
    return float(integrate.quad(density, -12.0, 12.0)[0])


def straggler_a(rollout_hosts: int, spread_s: float = STRAGGLER_S.value) -> float:
    """Eq. 4's A: the slowest rollout host's lead over their mean, which staleness absorbs."""
    return spread_s * expected_max(rollout_hosts)


def da_shape(co: step.StepShape, trainer_hosts: int) -> step.StepShape:
    """The co cell's step under da with `trainer_hosts` of its hosts training: the requests
    over the other hosts' replicas, training over the trainer hosts' devices."""
    rollout_hosts = co.hosts - trainer_hosts
    replicas = co.replicas_per_host * rollout_hosts
    rows, waves = replica_rows(co.requests, replicas, co.max_rows)
    engine = dataclasses.replace(co.engine, rows=rows, waves=waves)
    return dataclasses.replace(
        co, engine=engine, requests_per_replica=math.ceil(co.requests / replicas),
        hosts=rollout_hosts, cores=trainer_hosts * co.cores // co.hosts,
    )  # fmt: skip


def predict_da(co: step.StepShape, figures: DecodeFigures, trainer_hosts: int, **at) -> dict:
    """Eq. 4's terms and lambda_DA at a split; `at`: phi, mfu, host_s (step.predict_step's)
    and spread_s (the straggler's), the calibrated values unless given."""
    spread = at.pop("spread_s", STRAGGLER_S.value)
    constants = step.calibrated(co.workload) | at
    full = step.predict_step(co, figures, **constants)
    got = step.predict_step(da_shape(co, trainer_hosts), figures, **constants)
    host = constants["host_s"]
    terms = Eq4Terms(
        dr_h=sum(full[k] for k in ROLLOUT) + host, dt_h=full["train"], dpub_co=full["publish"],
        dr_hr=sum(got[k] for k in ROLLOUT) + host,
        dt_ht=got["train"] + host, dpub=got["publish"], dl=D_L_S.value,
        a=straggler_a(co.hosts - trainer_hosts, spread), tau=TAU_S.value,
    )  # fmt: skip
    rollout, train = terms.dr_hr + terms.dl, terms.dt_ht + terms.dpub
    return {  # A off the rollout branch only (Eq4Terms.lambda_da_rollout_absorbs)
        "lambda_co": full["step"], "lambda_da": terms.lambda_da_rollout_absorbs,
        "eq4_as_written": terms.lambda_da,
        "rollout_branch": rollout, "train_branch": train,
        "F": terms.fragmentation, "O": terms.hidden_training, "A": terms.a,
    }  # fmt: skip


def fit_residuals(shapes, at: dict) -> list[float]:
    """log(predicted / paper) of FIT_CELLS at the constants `at` (table3.fit_step_constants):
    Table F1's trainer-bound split, and App. C's F at GSM8K 8 chips."""
    (workload, chips, split), (shape, figures) = FIT_CELL, shapes[0]
    constants = dict(phi=at[workload], mfu=at["mfu"], host_s=at["host_s"],
                     request_s=at["request_s"])  # fmt: skip
    got = predict_da(shape, figures, round(split * shape.hosts), **constants)
    out = [math.log(got["lambda_da"] / TABLE_F1[(workload, chips)][split])]
    (workload, chips, split), (shape, figures) = F_CELL, shapes[1]
    constants["phi"] = at[workload]
    got = predict_da(shape, figures, round(split * shape.hosts), **constants)
    return [*out, math.log(max(got["F"], 1e-3) / F_PAPER_S)]


def f1_row(cell: tuple[str, int], co: step.StepShape, figures: DecodeFigures) -> dict:
    """One row of Table F1: co and each split the paper ran, predicted beside the paper, and
    the winner (the fastest of co and the splits) of each."""
    paper = TABLE_F1[cell]
    predicted: dict[str | float, float] = {"co": step.predict_cell_step(co, figures)["step"]}
    for split in paper:
        if isinstance(split, float):
            predicted[split] = predict_da(co, figures, round(split * co.hosts))["lambda_da"]
    winner = min(predicted, key=predicted.__getitem__)
    paper_winner = min(paper, key=paper.__getitem__)
    name = lambda s: "co" if s == "co" else f"da {100 * s:g}%"  # noqa: E731
    return {
        "workload": cell[0], "chips": cell[1],
        **{f"{name(s)} s": f"{predicted[s]:.2f} ({paper[s]})" for s in paper},
        "winner": name(winner), "paper winner": name(paper_winner),
        "right": winner == paper_winner,
        "status": "fit (one split)" if cell in {c[:2] for c in FIT_CELLS} else "held out",
    }  # fmt: skip


def co_shapes(cells, cache: list[DecodeFigures]) -> list[tuple[step.StepShape, DecodeFigures]]:
    """The co cells' step shapes as the co_vs_da experiment composes them (launch 0)."""
    want = {f"{workload} c{chips}_co": (workload, chips) for workload, chips in cells}
    jobs = [job for job in sweep_jobs(["-m", "+experiment=co_vs_da"])
            if "launch=0" in job and cell_of(job) in want]  # fmt: skip
    by_cell, lengths = {}, read_length_mix()
    for job, config in zip(jobs, compose_configs(jobs), strict=True):
        engine = cell_shape(cell_of(job), config, lengths)
        figures = decode_figures(cache, model=engine.model, tp=engine.tp, dtype=engine.dtype)
        by_cell[want[cell_of(job)]] = (step.step_shape(engine, config), figures)
    return [by_cell[cell] for cell in cells]


def table_f1_rows(cache: list[DecodeFigures]) -> list[dict]:
    """Every row of Table F1, predicted beside the paper."""
    cells = list(TABLE_F1)
    return [
        f1_row(cell, *shape) for cell, shape in zip(cells, co_shapes(cells, cache), strict=True)
    ]
