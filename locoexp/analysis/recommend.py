"""Beyond the paper: predict Eq. 4's `da` period at every valid split from `co` runs, and say
how wrong the prediction was against real `da` runs.

The paper's accounting explains measured steps and predicts none (Appendix C, "Scope"). Here the
terms come from `co` runs: D_R and D_T at H hosts, and at fewer hosts where a `co` run at that
host count is given. Otherwise D_R(H_r) is the measured D_R(H) times the step model's ratio
D_R(H_r) / D_R(H) (locoexp/analysis/table_f1.py: the run's config composed from its
.hydra/overrides.yaml, its decode iteration compiled by XLA-TPU for its chip, the calibrated
constants of constants.py), and D_T(H_t) = D_T(H) x H / H_t; a run the model cannot cover (no
overrides, no compiled iteration) falls back to scaling rollout by H / H_r too, and says so.
d_pub and d_L are the `co` run's publication (the weight gather plus the engine load) unless
given; tau as given (default 0). A, the straggler wait that staleness absorbs, is the real `da`
run's measured one where given, else the model's host-level straggler at H_r rollout hosts
(table_f1.straggler_a), or without the model the `co` run's straggler lead scaled by H / H_r.
As in table_f1, A comes off the rollout branch only.
Every prediction is printed with its error against a real `da` run of the same hosts and split
when one is given, and says "unmeasured" otherwise: the error is never assumed.
This module never imports jax.
"""

import dataclasses
from collections.abc import Sequence

import yaml

from locoexp.analysis import predict, step, table_f1
from locoexp.analysis.accounting import Eq4Terms
from locoexp.analysis.runs import Run, steady_median
from locoexp.compose import compose_config
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
        return self.terms.lambda_da_rollout_absorbs

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


@dataclasses.dataclass(frozen=True)
class RolloutModel:
    """The step model of a co run: D_R at a split over D_R at every host, and A at H_r."""

    shape: step.StepShape
    figures: predict.DecodeFigures

    def _rollout(self, shape: step.StepShape) -> float:
        got = step.predict_cell_step(shape, self.figures)
        return sum(got[k] for k in table_f1.ROLLOUT)

    def ratio(self, trainer_hosts: int) -> float:
        da = table_f1.da_shape(self.shape, trainer_hosts)
        return self._rollout(da) / self._rollout(self.shape)


def rollout_model(run: Run) -> RolloutModel | str:
    """The co run's step model, or why there is none (then rollout scales linearly)."""
    overrides = run.run_dir / ".hydra" / "overrides.yaml"
    if not overrides.exists():
        return f"{overrides} missing"
    try:
        config = compose_config(list(yaml.safe_load(overrides.read_text()) or []))
        engine = predict.cell_shape(str(run.run_dir), config, predict.read_length_mix())
        figures = predict.decode_figures(
            predict.read_decode_figures(), model=engine.model, tp=engine.tp, dtype=engine.dtype
        )
        if config.dataset.kind.value not in step.PHI:
            return f"no fitted phi for dataset {config.dataset.kind.value}"
    except ConfigError as refusal:
        return str(refusal)
    return RolloutModel(step.step_shape(engine, config), figures)


def predict_splits(
    co_runs: Sequence[Run],
    da_runs: Sequence[Run] = (),
    *,
    dl: float | None = None,
    tau: float = 0.0,
    steady: str | None = None,
    splits: Sequence[float] = (),
) -> tuple[float, list[Prediction]]:
    """lambda_co of the largest co run, and Eq. 4's lambda_DA predicted at each valid split
    (only the trainer shares in `splits` when given, e.g. Table F1's 0.5, 0.25, 0.125)."""
    if not co_runs or any(r.placement != "co" for r in co_runs):
        raise ConfigError("recommend needs co runs only (placement=co) as its terms.")
    by_hosts = {r.hosts: r for r in co_runs}
    top = by_hosts[max(by_hosts)]
    hosts = top.hosts
    dr_h, dt_h = _rollout(top, steady), _training(top, steady)
    dpub = _phases(top, "publish", steady=steady)
    lambda_co = _phases(top, "step", steady=steady)  # every steady record logs it (a float)
    lead = steady_median(top, "timing/straggler_s", override=steady) or 0.0
    model = rollout_model(top)
    predictions = []
    trainer_hosts = sorted({round(s * hosts) for s in splits} & set(range(1, hosts)))
    for ht in trainer_hosts or range(1, hosts):
        hr = hosts - ht
        real = _matching_da(da_runs, hosts=hosts, trainer_hosts=ht)
        absorbed = None if real is None else steady_median(real, "timing/straggler_absorbed_s")
        dr_hr, dr_basis = _rollout_at(by_hosts.get(hr), model, dr_h, hosts, ht, steady)
        a_basis = "measured"
        if absorbed is None and dr_basis == "model":
            absorbed, a_basis = table_f1.straggler_a(hr), "model (host straggler)"
        elif absorbed is None:
            absorbed, a_basis = lead * hosts / hr, "scaled from co"
        train_run = by_hosts.get(ht)
        terms = Eq4Terms(
            dr_h=dr_h, dt_h=dt_h, dpub_co=dpub, dr_hr=dr_hr,
            dt_ht=_training(train_run, steady) if train_run else dt_h * hosts / ht,
            dpub=dpub, dl=dpub if dl is None else dl, a=absorbed, tau=tau,
        )  # fmt: skip
        predictions.append(
            Prediction(
                split=ht / hosts, trainer_hosts=ht, rollout_hosts=hr, terms=terms,
                basis=f"D_R {dr_basis}, D_T {'measured' if train_run else 'scaled'}, "
                f"A {a_basis}",
                measured_s=None if real is None else steady_median(real, "timing/step_s"),
                da_run=None if real is None else str(real.run_dir),
            )
        )  # fmt: skip
    return lambda_co, predictions


def _rollout_at(run, model, dr_h: float, hosts: int, ht: int, steady) -> tuple[float, str]:
    """D_R at H - ht rollout hosts: a co run of that size, else the model's ratio, else
    linear."""
    if run is not None:
        return _rollout(run, steady), "measured"
    if isinstance(model, RolloutModel):
        return dr_h * model.ratio(ht), "model"
    return dr_h * hosts / (hosts - ht), f"scaled ({model})"


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
