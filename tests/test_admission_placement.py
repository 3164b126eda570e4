"""Where admission runs, from the per-host records of real runs (Section 4.3, Figure 7a): under
`co` each host process admits its own share, at the same time as the others (the single
controller's one admitting process and each placement's shares: `test_step_loop`, whose golden
runs record them). Also: a profiled step's
breakdown reaches the records of a 2-host run (each host's trace parsed, then reduced; writing a
trace costs seconds per host, so only the `co` run profiles). Real GSM8K rows, the real Qwen3
tokenizer, a tiny Qwen3-vocabulary model; 2 local hosts."""

import json

import pytest
from dataset_options import shared_data

from locoexp.placement.admission import read_admission_logs

pytestmark = pytest.mark.slow
PROMPTS, GROUP, STEPS = 4, 4, 3  # 8 requests a host a step: where they are admitted is checked


def run_gsm8k(compose, placement: str, run_dir, *, profile: bool, meetings) -> list[dict]:
    """A short GSM8K 2-host run's step records, its host processes meeting at every admission in
    `meetings` (`support.rendezvous`)."""
    folder = shared_data("gsm8k")
    config = compose(
        [
            "model=tiny_qwen",
            "model.hidden_dim=64",
            "model.mlp_dim=128",
            "model.num_layers=1",
            "model.head_dim=16",
            "dataset=gsm8k",
            f"dataset.data_files={folder / 'train.jsonl'}",
            "dataset.eval_data_files=null",
            "dataset.max_train_rows=256",
            f"dataset.prompts_per_step={PROMPTS}",
            f"dataset.samples_per_prompt={GROUP}",
            "dataset.max_prompt_tokens=256",
            "dataset.max_new_tokens=2",
            f"placement={placement}",
            "hardware.hosts=2",
            f"steps={STEPS}",
            "eval_every_steps=0",
            f"profile_steps={[2] if profile else []}",
            "logger=none",
        ]
    )
    launch_meeting(config, run_dir, meetings)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "timing/step_s" in r]


def launch_meeting(config, run_dir, meetings) -> None:
    """What `locoexp.main.launch` does for a local co run, each host process's session being
    `support.rendezvous.run_session_meeting`."""
    from support.rendezvous import run_session_meeting

    from locoexp.metrics.run_output import RunFiles
    from locoexp.placement.launch import launch_local_processes
    from locoexp.session.build import build_spec

    spec = build_spec(config)
    layout = spec.layout
    files = RunFiles(str(run_dir), None, None, False)
    code = launch_local_processes(
        run_session_meeting,
        (spec, files, str(meetings)),
        num_processes=layout.processes,
        devices_per_process=layout.devices_per_process,
        coordinator_port=spec.coordinator.port,
        bind_address=spec.coordinator.bind_address,
    )
    assert code == 0


def test_co_hosts_admit_their_own_share_in_their_own_processes_in_parallel(compose, tmp_path):
    # Each host process meets the other at the start of every admission (`support.rendezvous`,
    # through the rollout half's `on_first_request`), so that the check below does not depend on
    # how the machine schedules two ~10 ms admissions: parallel hosts meet at once; a host that
    # waited for the other's admission to end would never meet it and fail the run at the
    # rendezvous' deadline.
    meetings = tmp_path / "rendezvous"
    meetings.mkdir()
    records = run_gsm8k(compose, "co", tmp_path / "run", profile=True, meetings=meetings)
    expected = {f"started-{h}-{n}" for h in range(2) for n in range(STEPS)}
    assert {p.name for p in meetings.iterdir()} == expected  # every admission met its peer
    logs = read_admission_logs(tmp_path / "run")
    assert sorted(logs) == ["host0", "host1"]
    pids = {name: {s["pid"] for s in steps} for name, steps in logs.items()}
    assert all(len(p) == 1 for p in pids.values()) and pids["host0"] != pids["host1"]
    for name, steps in logs.items():
        assert all(s["requests"] == PROMPTS * GROUP // 2 for s in steps), name
    # Every step's two admissions (64 requests each) overlap in wall time: each host submitted
    # its last request after the other had submitted its first.
    for a, b in zip(logs["host0"], logs["host1"], strict=True):
        assert min(a["last_submitted_ns"], b["last_submitted_ns"]) > max(
            a["first_submitted_ns"], b["first_submitted_ns"]
        ), (a, b)
    assert records[1]["admission/requests"] == PROMPTS * GROUP // 2  # per host, reduced
    check_breakdown(records, tmp_path / "run")


def check_breakdown(records: list[dict], run_dir) -> None:
    """Only the profiled step carries `breakdown/*`; its shares sum to 1; the trace is kept."""
    assert all("breakdown/host_share" not in r for r in records[:2])
    shares = [records[2][f"breakdown/{k}_share"] for k in ("compute", "network", "host")]
    assert sum(shares) == pytest.approx(1.0) and all(0 <= s <= 1 for s in shares)
    assert records[2]["breakdown/compute_share"] > 0
    assert list((run_dir / "profile" / "step2").glob("host0/plugins/profile/*/*.xplane.pb"))
    check_timings(records)


def check_timings(records: list[dict]) -> None:
    for record in records:
        assert record["timing/host_orchestration_s"] <= record["timing/step_s"]
        assert 0 < record["timing/head_interval_s"] < record["timing/step_s"]
