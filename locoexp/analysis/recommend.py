"""Beyond the paper: predict Eq. 4's `da` period at every valid split from `co` runs, and say
how wrong the prediction was against real `da` runs.

The paper's accounting explains measured steps and predicts none (Appendix C, "Scope"). Here the
terms come from `co` runs only: D_R and D_T at H hosts, and at fewer hosts where a `co` run at
that host count is given; otherwise they are scaled by H / H_r (rollout) and H / H_t (training),
the work being spread over fewer hosts. d_pub and d_L are taken as the `co` run's publication
(the weight gather plus the engine load) unless given; tau as given (default 0). A, the
straggler wait that staleness absorbs, is the real `da` run's measured one where given, else
the `co` run's straggler lead (`timing/straggler_s`: the slowest rollout host over the mean)
scaled by H / H_r like D_R: a da schedule whose hosts run at their own pace does not wait for
it.
Every prediction is printed with its error against a real `da` run of the same hosts and split
when one is given, and says "unmeasured" otherwise: the error is never assumed.
This module never imports jax.
"""

import dataclasses
from collections.abc import Sequence

from locoexp.analysis.accounting import Eq4Terms
from locoexp.analysis.runs import Run, steady_median
from locoexp.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prediction:
    split: float  # trainer share of the hosts
    trainer_hosts: int
    rollout_hosts: int
    terms: Eq4Terms
    basis: str  # where D_R(H_r) and D_T(H_t) came from: "measured" or "scaled"
    measured_s: float | None  # lambda_DA of a real da run, when given
    da_run: str | None

    @property
    def predicted_s(self) -> float:
        return self.terms.lambda_da

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured, or None when no real da run was given."""
        if self.measured_s is None:
            return None
        return (self.predicted_s - self.measured_s) / self.measured_s


def _phases(run: Run, *names: str, steady: str | None) -> float:
    total = 0.0
    for name in names:
        value = steady_median(run, f"timing/{name}_s", override=steady)
        if value is None:
            raise ConfigError(
                f"{run.run_dir} logs no steady timing/{name}_s: recommend needs a co run's "
                "admission, generation, reward, pack, train, publish and step times."
            )
        total += value
    return total


def _rollout(run: Run, steady: str | None) -> float:
    return _phases(run, "admission", "generation", "reward", steady=steady)


def _training(run: Run, steady: str | None) -> float:
    return _phases(run, "pack", "train", steady=steady)


def predict_splits(
    co_runs: Sequence[Run],
    da_runs: Sequence[Run] = (),
    *,
    dl: float | None = None,
    tau: float = 0.0,
    steady: str | None = None,
) -> tuple[float, list[Prediction]]:
    """lambda_co of the largest co run, and Eq. 4's lambda_DA predicted at each valid split."""
    if not co_runs or any(r.placement != "co" for r in co_runs):
        raise ConfigError("recommend needs co runs only (placement=co) as its terms.")
    by_hosts = {r.hosts: r for r in co_runs}
    top = by_hosts[max(by_hosts)]
    hosts = top.hosts
    dr_h, dt_h = _rollout(top, steady), _training(top, steady)
    dpub = _phases(top, "publish", steady=steady)
    lambda_co = _phases(top, "step", steady=steady)  # every steady record logs it (a float)
    predictions = []
    for ht in range(1, hosts):
        hr = hosts - ht
        rollout_run, train_run = by_hosts.get(hr), by_hosts.get(ht)
        dr_hr = _rollout(rollout_run, steady) if rollout_run else dr_h * hosts / hr
        dt_ht = _training(train_run, steady) if train_run else dt_h * hosts / ht
        real = _matching_da(da_runs, hosts=hosts, trainer_hosts=ht)
        absorbed = None if real is None else steady_median(real, "timing/straggler_absorbed_s")
        lead = steady_median(top, "timing/straggler_s", override=steady) or 0.0
        terms = Eq4Terms(
            dr_h=dr_h,
            dt_h=dt_h,
            dpub_co=dpub,
            dr_hr=dr_hr,
            dt_ht=dt_ht,
            dpub=dpub,
            dl=dpub if dl is None else dl,
            a=lead * hosts / hr if absorbed is None else absorbed,
            tau=tau,
        )
        predictions.append(
            Prediction(
                split=ht / hosts,
                trainer_hosts=ht,
                rollout_hosts=hr,
                terms=terms,
                basis=f"D_R {'measured' if rollout_run else 'scaled'}, "
                f"D_T {'measured' if train_run else 'scaled'}, "
                f"A {'scaled from co' if absorbed is None else 'measured'}",
                measured_s=None if real is None else steady_median(real, "timing/step_s"),
                da_run=None if real is None else str(real.run_dir),
            )
        )
    return lambda_co, predictions


def _matching_da(da_runs: Sequence[Run], *, hosts: int, trainer_hosts: int) -> Run | None:
    for run in da_runs:
        if run.placement != "da":
            raise ConfigError(f"--da {run.run_dir} is a {run.placement} run, not placement=da.")
        if run.hosts == hosts and round((run.split or 0) * hosts) == trainer_hosts:
            return run
    return None


def format_recommendation(lambda_co: float, predictions: Sequence[Prediction]) -> str:
    best = min(predictions, key=lambda p: p.predicted_s, default=None)
    lines = [
        f"co (measured): {lambda_co:.3f} s/step",
        f"{'split':>6} {'Ht/Hr':>6} {'predicted da':>13} {'measured da':>12} {'error':>8}  basis",
    ]
    for p in predictions:
        measured = "-" if p.measured_s is None else f"{p.measured_s:.3f}"
        error = "unmeasured" if p.error is None else f"{100 * p.error:+.0f}%"
        lines.append(
            f"{p.split:>6.3g} {p.trainer_hosts:>3}/{p.rollout_hosts:<2} {p.predicted_s:>12.3f}"
            f" {measured:>12} {error:>8}  {p.basis}"
        )
    if best is None:
        lines.append("favoured: co (one host: no split)")
    elif best.predicted_s < lambda_co:
        lines.append(
            f"favoured (predicted): da at split {best.split:g}, {best.predicted_s:.3f} s against "
            f"co {lambda_co:.3f} s"
            + (
                ""
                if best.error is None
                else f" (this prediction's error: {100 * best.error:+.0f}%)"
            )
        )
    else:
        lines.append(
            f"favoured (predicted): co; the best split {best.split:g} predicts "
            f"{best.predicted_s:.3f} s"
        )
    return "\n".join(lines)
