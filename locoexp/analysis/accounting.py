"""Appendix C's critical-path accounting (Eqs. 1-4, the four trade-offs) and Appendix E.1's
ratio model, as pure functions over measured terms.

The paper says its accounting explains measured steps and predicts none; `recommend` (in
locoexp/analysis/recommend.py) goes beyond it and is judged by its error against real runs.
Terms come from the command line or from run directories (`eq4_terms_from_runs`). Seconds
throughout unless a name says ms. This module never imports jax.
"""

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats

from locoexp.analysis.runs import Run, steady_steps


def longest_path(durations: Mapping[str, float], edges: Sequence[tuple[str, str]]) -> float:
    """Eq. 1: T_step = max over paths pi of sum_{v in pi} d_v, on an acyclic one-step graph."""
    best: dict[str, float] = {}
    preds: dict[str, list[str]] = {v: [] for v in durations}
    for a, b in edges:
        preds[b].append(a)

    def finish(v: str, seen: tuple[str, ...] = ()) -> float:
        if v in seen:
            raise ValueError(f"the step graph has a cycle through {v!r}.")
        if v not in best:
            best[v] = durations[v] + max((finish(p, (*seen, v)) for p in preds[v]), default=0.0)
        return best[v]

    return max(finish(v) for v in durations)


def decode_iteration_ms(
    *,
    kappa_ms: float,
    weight_bytes: float,
    kv_bytes: float,
    beta_eff: float,
    tp: int,
    tp_penalty_ms: float,
) -> float:
    """Eq. 2: d_iter(t) = kappa(t) + (Q_w / t + Q_KV) / beta_eff + C_TP(t), in ms."""
    return kappa_ms + 1e3 * (weight_bytes / tp + kv_bytes) / beta_eff + tp_penalty_ms


def tp_doubling_saving_ms(*, weight_bytes: float, beta_eff: float, tp: int = 1) -> float:
    """Eq. 2's bytes term saved by going from TP t to 2t: Q_w / (2 t beta_eff), in ms."""
    return 1e3 * weight_bytes / (2 * tp * beta_eff)


def admission_s(*, alpha0: float, alpha1: float, requests: Sequence[int]) -> float:
    """Eq. 3: alpha0 + alpha1 n on one process, or max_h (alpha0 + alpha1 n_h) per host."""
    return max(alpha0 + alpha1 * n for n in requests)


def fit_admission(requests: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    """Eq. 3's alpha0 (s) and alpha1 (s per request) of one stack: least squares of d_adm
    against the requests one process admits, over measured (n, d_adm) pairs."""
    alpha1, alpha0 = np.polyfit(np.asarray(requests, float), np.asarray(seconds, float), 1)
    return float(alpha0), float(alpha1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Eq4Terms:
    """Eq. 4's terms (seconds). DR/DT: rollout and training time; dpub: publication; dL: rollout
    weight load; A: straggler wait absorbed by staleness; tau: residual Ray overhead."""

    dr_h: float  # D_R(H): rollout on all H hosts (colocated)
    dt_h: float  # D_T(H): training on all H hosts
    dpub_co: float  # publication under co
    dr_hr: float  # D_R(H_r): rollout on the H_r rollout hosts of a split
    dt_ht: float  # D_T(H_t): training on the H_t trainer hosts
    dpub: float  # publication under da
    dl: float  # d_L
    a: float = 0.0
    tau: float = 0.0

    @property
    def fragmentation(self) -> float:
        """F = D_R(H_r) - D_R(H)."""
        return self.dr_hr - self.dr_h

    @property
    def hidden_training(self) -> float:
        """O = D_T(H) + d_pub."""
        return self.dt_h + self.dpub_co

    @property
    def lambda_co(self) -> float:
        """Eq. 4: lambda_co = D_R(H) + D_T(H) + d_pub (one serial chain, Eq. 1)."""
        return longest_path(
            {"rollout": self.dr_h, "train": self.dt_h, "publish": self.dpub_co},
            [("rollout", "train"), ("train", "publish")],
        )

    @property
    def lambda_da(self) -> float:
        """Eq. 4: lambda_DA = max{D_R(H_r) + d_L, D_T(H_t) + d_pub} - A + tau (two branches)."""
        branches = longest_path(
            {"load": self.dl, "rollout": self.dr_hr, "train": self.dt_ht, "publish": self.dpub},
            [("load", "rollout"), ("train", "publish")],
        )
        return branches - self.a + self.tau

    @property
    def lambda_da_rollout_absorbs(self) -> float:
        """Eq. 4 with A taken off the rollout branch only: max{D_R(H_r) + d_L - A, D_T(H_t) +
        d_pub} + tau. Equal to lambda_da where rollout is the longer branch by at least A (App.
        C's premise); where training is longer, the rollout hosts' wait hides nothing."""
        return max(self.dr_hr + self.dl - self.a, self.dt_ht + self.dpub) + self.tau


def eq4_verdict(*, o: float, a: float, f: float, dl: float, tau: float) -> dict:
    """Trade-off 4: with rollout the longer branch, disaggregation pays iff O + A > F + dL + tau.
    The difference is lambda_co - lambda_DA (seconds DA saves per step)."""
    gain, cost = o + a, f + dl + tau
    return {
        "O + A": gain,
        "F + dL + tau": cost,
        "da_saves_s": gain - cost,
        "favours": "da" if gain > cost else "co",
    }


def eq4_periods_verdict(terms: Eq4Terms) -> dict:
    """Eq. 4 in full on measured terms: the shorter period wins. The paper's shortcut
    (O + A > F + dL + tau) holds only while rollout is the longer da branch; say which is."""
    rollout_branch, trainer_branch = terms.dr_hr + terms.dl, terms.dt_ht + terms.dpub
    return {
        "lambda_co": terms.lambda_co,
        "lambda_da": terms.lambda_da,
        "longer_da_branch": "rollout" if rollout_branch >= trainer_branch else "training",
        "shortcut_applies": rollout_branch >= trainer_branch,
        "favours": "da" if terms.lambda_da < terms.lambda_co else "co",
    }


def eq4_terms_from_runs(co: Run, da: Run, *, steady: str | None = None) -> Eq4Terms:
    """Eq. 4's terms measured from a co run and a da run over their steady windows."""
    return eq4_terms_from_steps(
        steady_steps(co, override=steady), steady_steps(da, override=steady)
    )


def eq4_terms_from_steps(co: Sequence[dict], da: Sequence[dict]) -> Eq4Terms:
    """Eq. 4's terms from the steady step records of a co and a da run (medians; slowest host
    per phase as logged, so D_R(H_r) is the synchronous schedule's): D_R = admission +
    generation + reward, D_T = (transfer +) pack + train, d_pub = publish, d_L = load. A is the
    da run's `timing/straggler_absorbed_s` (the slowest host's rollout time its hosts at their
    own pace did not wait for; 0 for a run recorded before they were), tau the residual
    lambda_DA - (max{...} - A)."""

    def term(steps: Sequence[dict], *phases: str) -> float:
        values = [_median(steps, f"timing/{p}_s") for p in phases]
        return sum(v for v in values if v is not None)

    terms = Eq4Terms(
        dr_h=term(co, "admission", "generation", "reward"),
        dt_h=term(co, "pack", "train"),
        dpub_co=term(co, "publish"),
        dr_hr=term(da, "admission", "generation", "reward"),
        dt_ht=term(da, "transfer", "pack", "train"),
        dpub=term(da, "publish"),
        dl=term(da, "load"),
        a=_median(da, "timing/straggler_absorbed_s") or 0.0,
    )
    measured = _median(da, "timing/step_s") or 0.0
    return dataclasses.replace(terms, tau=measured - terms.lambda_da)


def _median(steps: Sequence[dict], key: str) -> float | None:
    values = [float(r[key]) for r in steps if isinstance(r.get(key), int | float)]
    return statistics.median(values) if values else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RatioFit:
    """Appendix E.1: T_PW = a T_LoCo + Delta, so R = a + Delta / T_LoCo (Eq. 5)."""

    deltas: list[float]  # per cell, Delta = T_PW - T_LoCo (a = 1)
    loo_predictions: list[float]  # R per cell from the mean Delta of the block's other cells
    slope: float  # a of a free least-squares fit
    slope_low: float
    slope_high: float


def fit_ratio_model(
    t_pw: Sequence[float], t_loco: Sequence[float], *, in_fit: Sequence[bool] | None = None
) -> RatioFit:
    """Eq. 5 on one block of cells: Delta per cell at a = 1, each cell checked against the mean
    Delta of the other in-fit cells, and a free fit of a with its 95% t interval (in-fit cells)."""
    pw, loco = np.asarray(t_pw, float), np.asarray(t_loco, float)
    keep = np.ones(pw.size, bool) if in_fit is None else np.asarray(in_fit, bool)
    deltas = pw - loco
    predictions = []
    for i in range(pw.size):
        others = keep.copy()
        others[i] = False
        predictions.append(float(1 + deltas[others].mean() / loco[i]))
    fit = stats.linregress(loco[keep], pw[keep])
    half = stats.t.ppf(0.975, keep.sum() - 2) * fit.stderr if keep.sum() > 2 else math.nan
    return RatioFit(
        deltas=[float(d) for d in deltas],
        loo_predictions=predictions,
        slope=float(fit.slope),
        slope_low=float(fit.slope - half),
        slope_high=float(fit.slope + half),
    )
