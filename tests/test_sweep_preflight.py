"""A multirun's jobs are every job of the experiment file's own sweep and the command line's,
in the basic sweeper's order, each composed and checked before the first one runs."""

import pytest
from hydra import compose, initialize_config_dir

from locoexp.compose import (
    CONFIG_DIR,
    EXPERIMENTS,
    compose_command_line,
    hydra_message,
    sweep_jobs,
)
from locoexp.errors import ConfigError


def test_an_experiment_files_sweep_is_expanded_with_the_command_lines():
    jobs = sweep_jobs(["-m", "+experiment=co_vs_da_cpu", "launch=0,1", "dry_run=true"])
    arms = {o for job in jobs for o in job if o.startswith("+arm=")}
    assert len(jobs) == 2 * len(arms) and len(arms) >= 4
    # the file's key `launch` keeps its place (outermost) with the command line's values
    assert [o for o in jobs[0] if o.startswith("launch=")] == ["launch=0"]
    assert [o for o in jobs[-1] if o.startswith("launch=")] == ["launch=1"]
    assert all("+experiment=co_vs_da_cpu" in job for job in jobs)


def test_without_multirun_there_is_one_job():
    assert sweep_jobs(["+experiment=co_vs_da_cpu", "dry_run=true"]) == [
        ["+experiment=co_vs_da_cpu", "dry_run=true"]
    ]


def test_glob_lists_a_groups_options():
    jobs = sweep_jobs(["-m", "+experiment=scale_study"])
    assert len(jobs) == 35  # Table H1's cells


def test_a_bad_value_for_one_job_of_the_sweep_is_refused_before_any_runs():
    # 3 hosts: the file's da splits 0.25 and 0.75 leave no whole host counts
    with pytest.raises(
        ConfigError, match=r"^job .*\+arm=da_25.*: split=0.25 with hardware.hosts=3"
    ):
        compose_command_line(["-m", "+experiment=co_vs_da_cpu", "hardware.hosts=3", "dry_run=true"])


def test_a_misspelt_key_inside_an_experiment_file_names_the_file_and_the_valid_keys(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "typo.yaml").write_text(
        "# @package _global_\ndataset:\n  prompts_per_stepp: 12\n"
    )
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        searchpath = EXPERIMENTS.replace("=[", f"=[file://{tmp_path},")
        with pytest.raises(Exception) as error:  # noqa: PT011  (Hydra's own exception types)
            compose(config_name="config", overrides=["+experiment=typo", searchpath])
    message = hydra_message(error.value)
    assert message.startswith("In 'experiment/typo': 'dataset.prompts_per_stepp' is not a config")
    assert "prompts_per_step," in message and "\n" not in message


def test_one_job_of_a_sweeping_experiment_says_the_grid_needs_multirun():
    from locoexp.preflight import dry_run_report, preflight  # noqa: PLC0415  (loads jax)

    report = dry_run_report(preflight(["+experiment=co_vs_da_cpu", "dry_run=true"]))
    assert report.endswith("plan every job with -m)")
    assert "sweeps launch=0,1,2, +arm=co_optimized,da_25,da_50,da_75" in report
