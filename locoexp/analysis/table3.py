"""Table 3's LoCoJAX cells against the step model (locoexp/analysis/step.py), and the fit of
its constants on the named fit set (issue 41 item 3).

The fit: four constants (each workload's phi, one per-step host time) by least squares of
log(predicted / paper) over the six base cells of FIT_SET (each workload's smallest and largest
slice), at a stated MFU (constants.MFU: not identifiable from these cells). Every other LoCoJAX
cell of Table 3 is held out: the base arm at the chip counts between, and the whole optimized
arm, which the model predicts as the base arm (its levers O1-O4 act on host work, one constant
here). Never imports jax.
"""

import math

import numpy as np
from scipy import optimize

from locoexp.analysis import predict, step, table_f1
from locoexp.analysis.constants import HOST_S, MFU, PHI, Constant

# Table 3, LoCoJAX base and optimized (s); SWE at 8 chips did not fit.
TABLE_3 = {
    ("gsm8k", 8): (5.56, 5.07),
    ("gsm8k", 16): (4.08, 3.32),
    ("gsm8k", 32): (2.83, 2.36),
    ("gsm8k", 64): (2.69, 2.03),
    ("numinamath_cot", 8): (154.7, 152.2),
    ("numinamath_cot", 16): (84.1, 89.4),
    ("numinamath_cot", 32): (45.5, 44.6),
    ("numinamath_cot", 64): (28.4, 28.0),
    ("swe_agent", 16): (64.2, 61.1),
    ("swe_agent", 32): (34.7, 31.6),
    ("swe_agent", 64): (19.2, 17.0),
}
FIT_SET = (
    ("gsm8k", 8, "co_base"),
    ("gsm8k", 64, "co_base"),
    ("numinamath_cot", 8, "co_base"),
    ("numinamath_cot", 64, "co_base"),
    ("swe_agent", 16, "co_base"),
    ("swe_agent", 64, "co_base"),
)
WORKLOADS = ("gsm8k", "numinamath_cot", "swe_agent")


def job(workload: str, chips: int, arm: str) -> list[str]:
    return [
        "+experiment=stack_comparison",
        f"+workload={workload}",
        f"hardware=tpu_v7x_{chips}",
        f"+arm={arm}",
    ]


def paper_step(workload: str, chips: int, arm: str) -> float:
    return TABLE_3[(workload, chips)][arm == "co_optimized"]


def shapes(cells, configs, cache) -> list[tuple[step.StepShape, predict.DecodeFigures]]:
    lengths, out = predict.read_length_mix(), []
    for (workload, chips, arm), config in zip(cells, configs, strict=True):
        engine = predict.cell_shape(f"{workload} {chips} {arm}", config, lengths)
        figures = predict.decode_figures(
            cache, model=engine.model, tp=engine.tp, dtype=engine.dtype
        )
        out.append((step.step_shape(engine, config), figures))
    return out


def fit_step_constants(fit_shapes, f1_shapes=None, *, mfu: float | None = None) -> dict:
    """phi per workload, the host seconds, the per-request host seconds and the MFU minimising
    the squared log errors of FIT_SET and, from `f1_shapes` (table_f1.FIT_CELLS' co shapes:
    (shape, figures) each), Table F1's trainer-bound split and App. C's F at GSM8K 8 chips.
    With `mfu` given (and no F1 shapes) the first fit's four: phi and the host seconds."""

    def residuals(x):
        at = dict(zip(UNKNOWNS, x, strict=False)) | ({} if mfu is None else {"mfu": mfu})
        at.setdefault("request_s", 0.0)
        out = []
        for (workload, chips, arm), (shape, figures) in zip(FIT_SET, fit_shapes, strict=True):
            got = step.predict_step(shape, figures, phi=at[workload], mfu=at["mfu"],
                                    host_s=at["host_s"], request_s=at["request_s"])  # fmt: skip
            out.append(math.log(got["step"] / paper_step(workload, chips, arm)))
        if f1_shapes is not None:
            out += table_f1.fit_residuals(f1_shapes, at)
        return out

    free = 4 if mfu is not None else len(UNKNOWNS)
    low, high = [0.01] * 3 + [0.0, 0.02, 0.0], [1.0] * 3 + [10.0, 1.0, 0.1]
    start = np.array([0.3, 0.3, 0.3, 0.5, 0.3, 0.001][:free])
    x = optimize.least_squares(residuals, start, bounds=(low[:free], high[:free])).x
    return dict(zip(UNKNOWNS, x, strict=False))


UNKNOWNS = (*WORKLOADS, "host_s", "mfu", "request_s")


def fitted_constants() -> dict[str, Constant]:
    return {**{f"phi {w}": PHI[w] for w in WORKLOADS}, "mfu": MFU, "host_s": HOST_S}


def table3_rows(cells, cell_shapes) -> list[dict]:
    """Each LoCoJAX cell of Table 3: predicted phases and step beside the paper's."""
    fit = set(FIT_SET)
    rows = []
    for (workload, chips, arm), (shape, figures) in zip(cells, cell_shapes, strict=True):
        got = {k: round(v, 3) for k, v in step.predict_cell_step(shape, figures).items()}
        got["iterations"] = round(got["iterations"])
        paper = paper_step(workload, chips, arm)
        rows.append(
            dict(workload=workload, chips=chips, arm=arm, **got, paper_s=paper,
                 error=round(got["step"] / paper - 1, 3),
                 status="fit" if (workload, chips, arm) in fit else "held out"),
        )  # fmt: skip
    return rows


def cells() -> list[tuple[str, int, str]]:
    return [(w, c, arm) for (w, c) in TABLE_3 for arm in ("co_base", "co_optimized")]
