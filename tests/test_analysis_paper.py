"""`python -m locoexp.analysis` fed the paper's own published numbers gets the paper's verdicts:
Table 3 (Appendix A's rule), Table F1 (Welch and paired), Appendix C's worked terms (Eqs. 2-4),
Table E3 (Appendix E.1's ratio model) and Table I2 (Appendix I)."""

import json
import subprocess
import sys

import numpy as np
import pytest
from run_dirs import noisy, write_run

from locoexp.analysis import accounting, compare, cost, quality
from locoexp.analysis.__main__ import main
from locoexp.analysis.runs import find_runs


def arm(tmp_path, name, median, *, launches=3, placement="co", levers=True, split=None, **kw):
    runs = []
    for launch in range(launches):
        runs.append(
            write_run(
                tmp_path / f"{name}-{launch}",
                noisy(median, seed=launch + 10 * sum(map(ord, name))),
                placement=placement,
                levers=levers,
                split=split,
                launch=launch,
                **kw,
            )
        )
    return runs


def test_compare_reads_table3_gsm8k_64_chips_as_locojax_faster(tmp_path, capsys):
    # Table 3: Pathways 6.75 s, LoCoJAX optimized 2.03 s (3.32x) at 64 chips, three launches each
    arm(tmp_path / "sweep", "pathways", 6.75, placement="single_controller", levers=False, hosts=16)
    arm(tmp_path / "sweep", "optimized", 2.03, hosts=16)
    code = main(
        [
            "compare",
            str(tmp_path / "sweep"),
            "--baseline",
            "placement.kind=single_controller",
            "--ours",
            "placement.kind=co",
            "--json",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["rule"] == "stacks"
    assert result["baseline"]["steady_steps"].startswith("23-38")  # Appendix A's second pass
    assert result["pooled"]["per_step"]["value"] == pytest.approx(6.75 / 2.03, rel=0.02)
    assert all(launch["per_token"]["low"] > 1.111 for launch in result["launches"])
    assert result["verdict"].startswith("ours faster (every lower bound above 1.111")


def test_compare_with_two_launches_per_arm_is_provisional(tmp_path):
    base = arm(tmp_path, "pw", 10.82, launches=2, placement="single_controller", levers=False)
    ours = arm(tmp_path, "base", 5.56, launches=2, levers=False)  # Table 3, GSM8K 8 chips
    result = compare.compare_arms(find_runs(base), find_runs(ours))
    assert result["verdict"].startswith("ours faster, provisional (2 launches")


def test_compare_inside_the_margin_gives_no_verdict(tmp_path):
    # a 5% gap sits inside the 1.111 margin that the head node alone can shift
    base = arm(tmp_path, "pw", 10.5, placement="single_controller", levers=False)
    ours = arm(tmp_path, "co", 10.0)
    result = compare.compare_arms(find_runs(base), find_runs(ours))
    assert result["verdict"].startswith("no verdict")


def test_compare_refuses_unequal_work(tmp_path):
    base = arm(tmp_path, "pw", 6.75, placement="single_controller", levers=False)
    ours = arm(tmp_path, "co", 2.03, completion_tokens=120.0)  # outputs 0.6x as long
    result = compare.compare_arms(find_runs(base), find_runs(ours))
    assert result["verdict"].startswith("not comparable")
    assert "completion_tokens_mean ratio 1.67" in result["verdict"]


def test_compare_reads_table_f1_swe_32_chips_as_colocation_faster(tmp_path):
    # Appendix F: colocated 31.1 s, the 4/4 split 40.4 s, ratio 1.299x, colocated faster
    da = arm(tmp_path, "da", 40.4, placement="da", split=0.5, dataset="swe_agent", hosts=8)
    co = arm(tmp_path, "co", 31.1, dataset="swe_agent", hosts=8)
    result = compare.compare_arms(find_runs(da), find_runs(co))
    assert result["rule"] == "within"
    assert result["welch"]["value"] == pytest.approx(40.4 / 31.1, rel=0.01)
    assert result["welch"]["low"] > 1 and result["paired"]["low"] > 1
    assert result["verdict"] == "ours faster (Welch and paired agree)"


def test_da_against_co_on_gsm8k_decides_on_the_welch_interval_alone(tmp_path):
    # Table F1, GSM8K 8 chips: the 50% split 8.20 s against colocated 5.08 s (1.61x); App. A
    # asks the paired-step bootstrap only on NuminaMath and SWE
    da = arm(tmp_path, "da", 8.20, placement="da", split=0.5, dataset="gsm8k", hosts=2)
    co = arm(tmp_path, "co", 5.08, dataset="gsm8k", hosts=2)
    result = compare.compare_arms(find_runs(da), find_runs(co))
    assert result["workload"] == "gsm8k"
    assert result["verdict"] == "ours faster (Welch)"
    # App. A's headline: launches averaged per cell, the ratio their geometric mean
    headline = result["headline"]
    assert headline["ratio"] == pytest.approx(8.20 / 5.08, rel=0.01)
    assert headline["ratio"] == pytest.approx(result["welch"]["value"])
    assert headline["baseline_s"] == pytest.approx(8.20, rel=0.01)


def test_compare_refuses_an_arm_that_pools_cells(tmp_path, capsys):
    """A sweep's `placement.kind=da` matched every split and `compare` pooled them as launches
    of one arm (co_vs_da_cpu: 9 launches labelled "da 0.25"); an arm is one cell's launches."""
    sweep = tmp_path / "sweep"
    arm(sweep, "co", 5.08, dataset="gsm8k", hosts=2)
    arm(sweep, "da25", 3.0, placement="da", split=0.25, dataset="gsm8k", hosts=2)
    arm(sweep, "da50", 4.0, placement="da", split=0.5, dataset="gsm8k", hosts=2)
    args = ["compare", str(sweep), "--baseline", "placement.kind=co", "--ours", "placement.kind=da"]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert "ours arm holds 6 runs" in error and "split (0.25, 0.5)" in error
    assert "add the key to --ours, e.g. split=0.25" in error
    assert main([*args, "split=0.25", "--json"]) == 0  # one cell's 3 launches
    headline = json.loads(capsys.readouterr().out)["headline"]
    assert headline["ratio"] == pytest.approx(5.08 / 3.0, rel=0.1)
    # two paths: each must hold one cell's runs
    assert main(["compare", str(sweep / "co-0"), str(sweep)]) == 2
    assert "give one cell's runs per path" in capsys.readouterr().err


def test_accounting_reads_eq4_terms_from_one_co_and_one_da_run(tmp_path, capsys):
    """`accounting --co RUN --da RUN` measures Eq. 4's terms from the two runs' steady steps; a
    sweep (it read the sweep's first run) or a run of the other placement is refused."""
    co = write_run(tmp_path / "sweep" / "co", [1.0] * 40, phases={"generation": 0.6, "train": 0.3})
    da = write_run(
        tmp_path / "sweep" / "da",
        [0.7] * 40,
        placement="da",
        split=0.5,
        phases={"generation": 0.5, "train": 0.6, "publish": 0.05},
    )
    assert main(["accounting", "--co", str(co), "--da", str(da), "--json"]) == 0
    terms = json.loads(capsys.readouterr().out)["eq4_terms"]
    assert (terms["dr_h"], terms["dt_h"], terms["dr_hr"]) == pytest.approx((0.6, 0.3, 0.5))
    assert terms["dt_ht"] == pytest.approx(0.6) and terms["dpub"] == pytest.approx(0.05)
    assert main(["accounting", "--co", str(tmp_path / "sweep"), "--da", str(da)]) == 2
    assert "--co takes one run for Eq. 4's terms" in capsys.readouterr().err
    assert main(["accounting", "--co", str(da), "--da", str(co)]) == 2
    assert "--co needs a placement=co run" in capsys.readouterr().err


def test_cost_refuses_seeds_of_two_cells(tmp_path, capsys):
    seeds(tmp_path / "sweep", "c4", chips=4, scores=(0.86,) * 4, hours_at_275=23.3)
    seeds(tmp_path / "sweep", "c16", chips=16, scores=(0.86,) * 4, hours_at_275=48.0)
    assert main(["cost", str(tmp_path / "sweep")]) == 2
    error = capsys.readouterr().err
    assert "ours arm holds 6 runs" in error and "hardware.chips (4, 16)" in error
    assert "add the key to --select" in error
    assert main(["cost", str(tmp_path / "sweep"), "--select", "hardware.chips=4"]) == 0


def test_da_against_co_with_two_launches_is_provisional(tmp_path):
    da = arm(tmp_path, "da", 40.4, placement="da", split=0.5, dataset="swe_agent", hosts=8)
    co = arm(tmp_path, "co", 31.1, dataset="swe_agent", hosts=8, launches=2)
    result = compare.compare_arms(find_runs(da), find_runs(co))
    assert result["verdict"].startswith("ours faster, provisional (2 launches per arm")


def test_eq4_gsm8k_8_chips_favours_colocation():
    # Appendix C trade-off 4: F = 2.9 s exceeds O = 1.1 s
    verdict = accounting.eq4_verdict(o=1.1, a=0.0, f=2.9, dl=0.0, tau=0.0)
    assert verdict["favours"] == "co"


def test_eq4_gsm8k_128_chips_favours_disaggregation_by_about_ten_percent():
    verdict = accounting.eq4_verdict(o=0.32, a=0.58, f=0.23, dl=0.49, tau=0.03)
    assert verdict["favours"] == "da"
    assert verdict["da_saves_s"] == pytest.approx(0.15)
    lambda_co = 1.73  # Table F1, GSM8K 128 chips, LoCoJAX-CO
    lambda_da = lambda_co - verdict["da_saves_s"]
    assert lambda_co / lambda_da == pytest.approx(1.10, abs=0.01)  # "about 10% faster"
    assert lambda_da == pytest.approx(1.56, abs=0.03)  # Table F1's 25% split: 1.56 s


def test_eq4_periods_follow_eq1_longest_paths():
    terms = accounting.Eq4Terms(
        dr_h=1.0,
        dt_h=0.2,
        dpub_co=0.12,
        dr_hr=1.23,
        dt_ht=0.6,
        dpub=0.1,
        dl=0.49,
        a=0.58,
        tau=0.03,
    )
    assert terms.lambda_co == pytest.approx(1.32)  # serial chain
    assert terms.lambda_da == pytest.approx(max(1.23 + 0.49, 0.6 + 0.1) - 0.58 + 0.03)
    assert terms.fragmentation == pytest.approx(0.23)
    assert terms.hidden_training == pytest.approx(0.32)


def test_accounting_command_prints_the_paper_tradeoffs():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "locoexp.analysis",
            "accounting",
            "--o",
            "0.32",
            "--a",
            "0.58",
            "--f",
            "0.23",
            "--dl",
            "0.49",
            "--tau",
            "0.03",
            "--eq2",
            "1.2e9",
            "3.32e12",
            "0.21",
            "0.68",
            "--decode-premium",
            "2.15",
            "0.90",
            "1800",
            "--eq3",
            "1.0",
            "0.06",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "favours da (da saves +0.150 s per step)" in out
    assert "bytes term 0.18 ms, saved 0.21 ms against 0.68 ms: TP1" in out  # trade-off 1, 0.6B
    assert "premium 1.25 ms/iteration = 2.25 s per step" in out  # trade-off 3
    assert "host-local admission saves 0.94 s" in out  # trade-off 2


def test_tp2_wins_at_4b_by_eq2():
    assert accounting.tp_doubling_saving_ms(weight_bytes=8.0e9, beta_eff=3.32e12) == pytest.approx(
        1.20, abs=0.01
    )
    # measured saving 1.16 ms against a 0.77-0.85 ms penalty: TP2 (Section 4.1)
    assert main(["accounting", "--eq2", "8.0e9", "3.32e12", "1.16", "0.85"]) == 0


def test_ratio_model_reproduces_table_e3_gsm8k():
    t_pw = [14.53, 9.64, 8.08, 7.65, 6.54, 6.55]
    t_loco = [10.06, 5.54, 3.98, 2.88, 2.55, 2.54]
    fit = accounting.fit_ratio_model(t_pw, t_loco)
    assert [round(r, 2) for r in fit.loo_predictions] == [1.42, 1.77, 2.07, 2.44, 2.68, 2.69]
    assert [round(d, 2) for d in fit.deltas] == [4.47, 4.10, 4.10, 4.77, 3.99, 4.01]
    assert (round(fit.slope, 2), round(fit.slope_low, 2), round(fit.slope_high, 2)) == (
        1.03,
        0.89,
        1.17,
    )


def test_ratio_model_reproduces_table_e3_numinamath_with_32b_outside_the_fit():
    fit = accounting.fit_ratio_model(
        [51.12, 70.34, 89.43, 99.20, 154.08],
        [26.71, 46.53, 68.95, 78.54, 149.67],
        in_fit=[True, True, True, True, False],
    )
    assert [round(r, 2) for r in fit.loo_predictions] == [1.81, 1.47, 1.33, 1.29, 1.15]
    assert (round(fit.slope, 2), round(fit.slope_low, 2), round(fit.slope_high, 2)) == (
        0.92,
        0.83,
        1.00,
    )


def test_table_i2_statuses_against_the_bar():
    assert cost.bar_status(1.245, 1.289) == "on the bar"  # 4 chips
    for low, high in [(1.424, 1.629), (1.492, 1.754), (2.301, 2.640), (2.138, 2.477)]:
        assert cost.bar_status(low, high) == "supported"
    assert cost.bar_status(1.0, 1.2) == "not supported"


def seeds(tmp_path, name, *, chips, scores, hours_at_275, seconds_per_update=10.0):
    """Three seeds scored at Table I3's updates; chip-hours to update 275 sum to hours_at_275."""
    runs = []
    for seed, factor in enumerate((0.95, 1.0, 1.05)):
        per_seed_s = hours_at_275 / 3 * factor * 3600 / chips
        start = per_seed_s - 275 * seconds_per_update  # job start-up before the first update
        step_s = [seconds_per_update] * 348
        step_s[0] += start - 60.0  # write_run starts the clock at 60 s
        runs.append(
            write_run(
                tmp_path / f"{name}-{seed}",
                step_s,
                hosts=chips // 4,
                seed=seed,
                passes=6,
                evals=dict(zip((275, 300, 325, 348), scores, strict=True)),
            )
        )
    total = sum(cost.build_cell(find_runs(runs), target=0.85).seed_chip_hours_at(275))
    assert total == pytest.approx(hours_at_275)
    return find_runs(runs)


def test_cost_reproduces_table_i2_4_chips(tmp_path):
    # Table I2: LoCoJAX base 23.326 chip-hours (275/300), Pathways 29.550 (275/300): 1.267
    ours = cost.build_cell(
        seeds(tmp_path, "base", chips=4, scores=(0.86, 0.87, 0.87, 0.88), hours_at_275=23.326),
        target=0.85,
    )
    pw = cost.build_cell(
        seeds(tmp_path, "pw", chips=4, scores=(0.86, 0.87, 0.86, 0.86), hours_at_275=29.550),
        target=0.85,
    )
    row = cost.compare_cells(ours, pw)
    assert row["ours"]["charged_pair"] == [275, 300] == row["against"]["charged_pair"]
    assert row["ratio"]["value"] == pytest.approx(1.267, abs=0.001)
    assert row["ratio"]["low"] <= 1.267 <= row["ratio"]["high"]
    assert row["steady_updates"] == [25, 275]  # Table I2's steady segment


def test_cost_charges_stacks_at_their_own_pairs_as_table_i2_16_chips(tmp_path):
    # LoCoJAX base misses update 300 (charged 325/348, 48.013), Pathways 275/300 (77.591)
    ours = cost.build_cell(
        seeds(tmp_path, "base", chips=16, scores=(0.86, 0.849, 0.86, 0.87), hours_at_275=40.0),
        target=0.85,
    )
    pw = cost.build_cell(
        seeds(tmp_path, "pw", chips=16, scores=(0.86, 0.86, 0.87, 0.87), hours_at_275=77.591),
        target=0.85,
    )
    row = cost.compare_cells(ours, pw)
    assert row["ours"]["charged_pair"] == [325, 348]
    assert row["against"]["charged_pair"] == [275, 300]
    # same checkpoint: both charged at each update of the earlier stack's pair
    assert row["same_checkpoint"][0] == pytest.approx(77.591 / 40.0, rel=1e-6)
    assert len(row["same_checkpoint"]) == 2


def test_cost_uses_the_runs_own_target(tmp_path):
    runs = seeds(tmp_path, "base", chips=4, scores=(0.5, 0.6, 0.6, 0.7), hours_at_275=10.0)
    cell = cost.build_cell(runs, target=None)
    assert cell.target == 0.85 and not cell.charge().reached
    assert cost.build_cell(runs, target=0.55).charge().charged_step + 1 == 300


def test_eq4_periods_decide_when_training_is_the_longer_da_branch():
    # measured on this CPU (experiments/LOG.md, co_vs_da_cpu, split 0.25): the shortcut says da,
    # but the 1-host trainer branch is the longer one and da's period is the longer period
    terms = accounting.Eq4Terms(
        dr_h=0.307, dt_h=1.453, dpub_co=0.236, dr_hr=1.487, dt_ht=3.350, dpub=0.036, dl=0.249
    )
    shortcut = accounting.eq4_verdict(
        o=terms.hidden_training, a=0.0, f=terms.fragmentation, dl=terms.dl, tau=0.0
    )
    periods = accounting.eq4_periods_verdict(terms)
    assert shortcut["favours"] == "da"
    assert (periods["longer_da_branch"], periods["favours"]) == ("training", "co")


def test_the_analysis_package_never_imports_jax():
    code = (
        "import sys, locoexp.analysis.__main__, locoexp.analysis.cli, locoexp.analysis.figures; "
        "assert 'jax' not in sys.modules, 'jax was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def accounting_text(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "locoexp.analysis", "accounting", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout


@pytest.mark.slow
def test_accounting_on_the_papers_numbers_prints_the_papers_verdicts():
    # App. C trade-off 1 (Eq. 2): TP1 -> TP2 saves 0.21 ms at 0.6B against 0.68 ms, 1.16 ms at
    # 4B against 0.77-0.85 ms; bytes terms at 3.32 TB/s 0.18 and 1.20 ms
    assert "bytes term 0.18 ms" in accounting_text("--eq2", "1.195e9", "3.32e12", "0.21", "0.68")
    assert accounting_text("--eq2", "1.195e9", "3.32e12", "0.21", "0.68").strip().endswith("TP1")
    assert accounting_text("--eq2", "7.97e9", "3.32e12", "1.16", "0.85").strip().endswith("TP2")
    # Eq. 3, one alpha per stack: 2,048 requests on the Pathways head (~1.0 s) against 128 per
    # LoCoJAX host at 64 chips (under 0.06 s)
    eq3 = accounting_text(
        "--admission", "pathways", "0", "0.00049", "2048",
        "--admission", "locojax", "0", "0.00047", *["128"] * 16,
    )  # fmt: skip
    assert "(pathways): alpha0 0 s + alpha1 0.00049 s x max 2048 requests = 1.004 s" in eq3
    assert "(locojax): alpha0 0 s + alpha1 0.00047 s x max 128 requests = 0.060 s" in eq3
    # Eq. 4 at GSM8K 128 chips with the co step of Table F1: da about 10% faster, 1.58 s
    eq4 = accounting_text(
        *("--o", "0.32", "--a", "0.58", "--f", "0.23", "--dl", "0.49", "--tau", "0.03"),
        *("--lambda-co", "1.73"),
    )
    assert "favours da" in eq4 and "lambda_DA 1.580 s, DA/CO 0.913" in eq4
    assert "favours co" in accounting_text("--o", "1.1", "--f", "2.9", "--lambda-co", "5.08")
    # E.1 on Table E3's NuminaMath block, 32B out of the fit: the model column, and Figure 8's
    # free slope a = 0.92
    e1 = accounting_text(
        "--ratio-model",
        *("--t-pw", "51.12", "70.34", "89.43", "99.20", "154.08"),
        *("--t-loco", "26.71", "46.53", "68.95", "78.54", "149.67"),
        *("--out-of-fit", "4"),
    )
    assert "R from the others' Delta 1.81, 1.47, 1.33, 1.29, 1.15" in e1
    assert "free fit a = 0.92" in e1 and "out of the fit: cells 4" in e1


def test_the_admission_fit_recovers_eq3s_alphas():
    # d_adm = 2 ms + 0.49 ms per request (the Pathways head's ~1.0 s for 2,048 requests)
    requests = [128, 512, 2048]
    alpha0, alpha1 = accounting.fit_admission(requests, [0.002 + 0.00049 * n for n in requests])
    assert alpha0 == pytest.approx(0.002) and alpha1 == pytest.approx(0.00049)


def compiled_arm(tmp_path, name, median, *, compiles=None, slow=None, placement="co", **kw):
    """Three launches with steady step times `median` (+0.2% per launch) that record compile
    events (`timing/compile_s`): `compiles` {step: seconds} compiled in that step (its step time
    grows by as much), `slow` {step: seconds} a step that slow without compiling."""
    runs = []
    for launch in range(3):
        times = noisy(median * (1 + 0.002 * launch), spread=0.0)
        recorded = {step: {"timing/compile_s": 0.0} for step in range(len(times))}
        recorded[0] = {"timing/compile_s": 9 * median}  # start-up compiles: not a scored step
        for step, seconds in (compiles or {}).items():
            times[step] += seconds
            recorded[step] = {"timing/compile_s": seconds}
        for step, seconds in (slow or {}).items():
            times[step] = seconds
        runs.append(
            write_run(
                tmp_path / f"{name}-{launch}",
                times,
                placement=placement,
                launch=launch,
                step_extra=recorded,
                **kw,
            )
        )
    return find_runs(runs)


def test_the_compile_charge_back_is_the_recorded_compile_seconds(tmp_path):
    # App. A: where scored steps recompile, the ratio with compile time charged back is reported
    # too; a scored step (23-38) that compiled for 1.5 s is charged exactly 1.5 s over the 16
    # scored steps, though it is not 3x the median (the old heuristic charged nothing)
    da = compiled_arm(tmp_path, "da", 5.0, compiles={30: 1.5}, placement="da", split=0.5)
    co = compiled_arm(tmp_path, "co", 5.0)
    result = compare.compare_arms(da, co)
    assert result["headline"]["ratio"] == pytest.approx(1.0)  # the median drops the compile
    charged = result["compile_charged"]
    launch_s = 5.0 * (1 + 0.002 * np.arange(3))
    assert charged["baseline_s"] == pytest.approx(np.mean(launch_s + 1.5 / 16))
    assert charged["ratio"] == pytest.approx(np.exp(np.mean(np.log(1 + 1.5 / 16 / launch_s))))
    assert charged["compile_s"] == {"baseline": pytest.approx(4.5), "ours": 0.0}
    assert "with compile time charged back (3 scored steps compiled" in (
        compare.format_comparison(result)
    )


def test_a_slow_scored_step_without_a_compile_event_charges_nothing(tmp_path):
    # a step 20x the median that recorded no compile is noise or a stall, not a compile: the
    # 3x-median heuristic charged it back as one
    da = compiled_arm(tmp_path, "da", 5.0, slow={30: 100.0}, placement="da", split=0.5)
    co = compiled_arm(tmp_path, "co", 5.0)
    result = compare.compare_arms(da, co)
    assert result["compiles_recorded"] and result["compile_charged"] is None


def test_runs_without_compile_events_say_so_and_charge_nothing(tmp_path):
    base = arm(tmp_path, "pw", 6.75, placement="single_controller", levers=False)
    ours = arm(tmp_path, "co", 2.03)
    result = compare.compare_arms(find_runs(base), find_runs(ours))
    assert not result["compiles_recorded"] and result["compile_charged"] is None
    assert "compile time: not recorded by these runs" in compare.format_comparison(result)


@pytest.mark.parametrize(("co_reward", "within"), [(0.504, True), (0.506, False)])
def test_da_against_co_reports_section_4_4s_training_reward_band(tmp_path, co_reward, within):
    # Section 4.4: DA's training reward stays within the pre-registered 0.005 band of CO's; the
    # band's verdict flips as the gap crosses 0.005
    da = arm(tmp_path, "da", 8.20, placement="da", split=0.5, hosts=2,
             extra={"rollout/reward_mean": 0.5})  # fmt: skip
    co = arm(tmp_path, "co", 5.08, hosts=2, extra={"rollout/reward_mean": co_reward})
    result = compare.compare_arms(find_runs(da), find_runs(co))
    band = result["reward_band"]
    assert band["gap"] == pytest.approx(co_reward - 0.5) and band["within"] is within
    where = "within" if within else "outside"
    assert f"training reward {where} the pre-registered 0.005 band" in (
        compare.format_comparison(result)
    )
    assert result["verdict"] == "ours faster (Welch)"  # a timing verdict, read beside the band


def test_the_reward_band_without_reward_records_is_one_sentence(tmp_path):
    da = arm(tmp_path, "da", 8.20, placement="da", split=0.5, hosts=2)
    co = arm(tmp_path, "co", 5.08, hosts=2)
    (co[1] / "metrics.jsonl").write_text(
        (co[1] / "metrics.jsonl").read_text().replace('"rollout/reward_mean"', '"other"')
    )
    band = compare.compare_arms(find_runs(da), find_runs(co))["reward_band"]
    assert band["verdict"].startswith("training reward band not judged: ")
    assert "co-1 logs no rollout/reward_mean on a scored step" in band["verdict"]


@pytest.mark.parametrize("launches", [2, 3])
def test_an_ablation_rung_under_three_launches_is_provisional(tmp_path, launches):
    # App. A: a rung holds on disjoint launch ranges and a ratio beyond both spreads; like every
    # other verdict it is provisional with fewer than three launches per arm
    off = arm(tmp_path, "off", 6.0, levers=False, launches=launches)
    on = arm(tmp_path, "on", 5.0, launches=launches)
    result = compare.compare_arms(find_runs(off), find_runs(on))
    assert result["rule"] == "rung"
    if launches == 2:
        assert result["verdict"] == (
            "ours faster, provisional (2 launches per arm; Appendix A asks 3)"
        )
    else:
        assert result["verdict"] == "ours faster (rung holds)"


# Table I6's spread: 18 seeds per stack whose scores differ by +-0.55 pp around the stack's mean
SEED_DEVIATIONS = 0.0055 * np.resize([-1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 0.0, 0.0], 18) / 0.9


def scored_seeds(tmp_path, name, mean, *, seeds=18, eval_rows=1319, skip=None):
    """Seeds of one stack scored at updates 275 and 300 (Table I6's mean of the two), around
    `mean`; `skip` leaves that update's score out of every seed's records."""
    runs = []
    for seed, deviation in enumerate(SEED_DEVIATIONS[:seeds]):
        score = mean + deviation
        evals = {275: score - 0.001, 300: score + 0.001}
        if skip:
            del evals[skip]
        dataset = {"kind": "gsm8k", "batches_per_pass": 150, "passes": 2, "eval_size": eval_rows}
        runs.append(
            write_run(
                tmp_path / f"{name}-{seed}",
                [10.0] * 300,
                hosts=1,
                seed=seed,
                evals=evals,
                config={"dataset": dataset, "eval_at_updates": [275, 300]},
            )
        )
    return [str(r) for r in runs]


@pytest.mark.parametrize(("gap", "matches"), [(0.0065, True), (0.02, False)])
def test_cost_reads_table_i6s_held_out_quality_against_the_floor(tmp_path, capsys, gap, matches):
    # Table I6: Pathways minus LoCoJAX +0.65 pp [+0.28, +1.02] (18 v 18), below the ~1 pp floor
    # of one checkpoint (1,319 GSM8K rows at 85%): "matches within evaluation noise"; a 2 pp gap
    # is beyond the floor and the interval
    ours = scored_seeds(tmp_path, "loco", 0.85)
    pathways = scored_seeds(tmp_path, "pw", 0.85 + gap)
    assert main(["cost", *ours, "--against", *pathways, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["quality"]
    assert row["updates"] == [275, 300] and row["runs"] == [18, 18]
    assert row["difference_pp"] == pytest.approx(100 * gap)
    p = 0.85 + gap / 2  # both cells' seeds pooled: one binomial standard error of 1,319 rows
    assert row["floor_pp"] == pytest.approx(100 * np.sqrt(p * (1 - p) / 1319))
    if matches:
        assert row["interval_pp"] == pytest.approx([0.28, 1.02], abs=0.03)
        assert row["floor_pp"] == pytest.approx(0.98, abs=0.01)  # Table I6's ~1 pp
        assert row["verdict"].startswith("matches within evaluation noise (0.65 pp is below")
    else:
        assert (
            row["verdict"] == "against higher by 2.00 pp, beyond the 0.96 pp floor and the interval"
        )
    assert main(["cost", *ours, "--against", *pathways]) == 0
    assert "held-out quality (Table I6), against - ours at updates 275/300" in (
        capsys.readouterr().out
    )


def test_table_i6_with_missing_scores_or_one_cell_is_one_sentence(tmp_path, capsys):
    ours = scored_seeds(tmp_path, "loco", 0.85, seeds=3, skip=300)
    pathways = scored_seeds(tmp_path, "pw", 0.86, seeds=3)
    assert main(["cost", *ours, "--against", *pathways]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert "loco-0 has no held-out accuracy (eval/accuracy) at update 300" in error
    assert main(["cost", *pathways, "--quality-at", "275", "300"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "needs two cells" in error
    # one seed a cell: no Welch interval; beyond the floor, no verdict
    assert main(["cost", pathways[2], "--against", ours[0], "--quality-at", "275", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["quality"]
    assert row["interval_pp"] is None
    assert row["verdict"] == "no verdict (the Welch interval needs two seeds per cell)"


def test_table_i6s_reading_without_a_known_floor_leans_on_the_interval_alone():
    # the whole split scored and no --eval-rows: the floor is unknown, and the verdict says so
    assert quality.quality_verdict(0.65, [0.28, 1.02], None) == (
        "against higher by 0.65 pp (floor unknown: give --eval-rows)"
    )
    assert quality.quality_verdict(-0.65, [-1.1, 0.1], None).startswith(
        "no verdict (the Welch interval includes 0) (floor unknown"
    )
    assert quality.quality_verdict(-0.65, [-1.1, -0.2], 0.98).startswith("matches within")
