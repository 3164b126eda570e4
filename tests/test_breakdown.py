"""The step breakdown (Table H1's compute / network / host orchestration) from profiler traces:
a hand-built trace with a hand-computed answer, a recorded CPU trace fixture
(tests/fixtures/record_breakdown_trace.py), and a live capture."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.profiler import ProfileData

from locoexp.metrics.breakdown import (
    EXCHANGE_PREFIX,
    STEP_ANNOTATION,
    load_trace,
    profile_step,
    step_breakdown,
    trace_file,
)

FIXTURES = Path(__file__).parent / "fixtures"


def xspace(events: list[tuple[str, str, int, int, dict]]) -> ProfileData:
    """A one-plane trace: (line, name, start_ns, duration_ns, stats) per event."""
    names = sorted({e[1] for e in events})
    stat_names = sorted({k for e in events for k in e[4]})
    lines = {}
    for line, name, start, duration, stats in events:
        fields = " ".join(
            f"stats {{ metadata_id: {stat_names.index(k) + 1} "
            + (f'str_value: "{v}"' if isinstance(v, str) else f"int64_value: {v}")
            + " }"
            for k, v in stats.items()
        )
        lines.setdefault(line, []).append(
            f"events {{ metadata_id: {names.index(name) + 1} offset_ps: {start * 1000} "
            f"duration_ps: {duration * 1000} {fields} }}"
        )
    text = 'planes { id: 1 name: "/host:CPU"\n'
    for i, (line, evs) in enumerate(lines.items()):
        text += f'lines {{ id: {i + 1} name: "{line}" timestamp_ns: 0\n' + "\n".join(evs) + "}\n"
    for i, name in enumerate(names):
        text += f'event_metadata {{ key: {i + 1} value {{ id: {i + 1} name: "{name}" }} }}\n'
    for i, name in enumerate(stat_names):
        text += f'stat_metadata {{ key: {i + 1} value {{ id: {i + 1} name: "{name}" }} }}\n'
    return ProfileData.from_text_proto(text + "}")


def op(line, name, start, duration, device):
    return (line, name, start, duration, {"hlo_op": name, "device_ordinal": device})


def test_hand_computed_breakdown_of_two_devices():
    # Step window [100, 1100). Device 0: a `while` op over [200, 600) holding an all-gather at
    # [300, 400) (network wins inside it), an op that starts before the window, and a
    # reduce-scatter-start/done pair. Device 1: one fusion [200, 300). An exchange annotation
    # [550, 800) counts only where the device is idle. Outside the window nothing counts.
    profile = xspace(
        [
            ("python", STEP_ANNOTATION, 100, 1000, {"step_num": 5}),
            ("python", STEP_ANNOTATION, 2000, 500, {"step_num": 6}),
            ("python", EXCHANGE_PREFIX + "ray_get", 550, 250, {}),
            op("t0", "fusion.9", 50, 100, 0),  # [100, 150) inside the window
            op("t0", "while.2", 200, 400, 0),
            op("t1", "all-gather.3", 300, 100, 0),
            op("t0", "reduce-scatter-start.1", 900, 20, 0),
            op("t0", "reduce-scatter-done.1", 950, 30, 0),
            op("t2", "fusion.4", 200, 100, 1),
            op("t2", "fusion.5", 1200, 100, 1),  # after the window
        ]
    )
    b = step_breakdown(profile, 5)
    # device 0: compute 50 + 300 = 350, network 100 + 50 + exchange [600, 800) = 350, host 300
    # device 1: compute 100, network exchange [550, 800) = 250, host 650
    assert b.devices == 2 and b.step_s == pytest.approx(1000e-9)
    assert b.compute_s == pytest.approx(225e-9)
    assert b.network_s == pytest.approx(300e-9)
    assert b.host_s == pytest.approx(475e-9)
    shares = b.metrics()
    assert shares["breakdown/compute_share"] == pytest.approx(0.225)
    assert shares["breakdown/network_share"] == pytest.approx(0.300)
    assert shares["breakdown/host_share"] == pytest.approx(0.475)


def test_a_trace_without_the_step_is_refused():
    profile = xspace([("python", STEP_ANNOTATION, 0, 10, {"step_num": 1})])
    with pytest.raises(ValueError, match="step 2"):
        step_breakdown(profile, 2)


def test_recorded_cpu_trace_fixture():
    facts = json.loads((FIXTURES / "breakdown_step.json").read_text())
    profile = load_trace(FIXTURES / "breakdown_step.xplane.pb")
    b = step_breakdown(profile, facts["step"])
    shares = b.metrics()
    total = sum(shares[f"breakdown/{k}_share"] for k in ("compute", "network", "host"))
    assert total == pytest.approx(1.0, abs=1e-12)
    assert b.devices == facts["devices"]
    # The host-only pause is host orchestration; the socket exchange and both all-gathers are
    # network; the matmul and tanh are compute.
    assert b.host_s >= facts["host_pause_s"]
    exchange = [
        e.duration_ns * 1e-9
        for plane in profile.planes
        for line in plane.lines
        for e in line.events
        if e.name.startswith(EXCHANGE_PREFIX)
    ]
    assert len(exchange) == 1 and b.network_s > exchange[0] > 0.5 * facts["exchange_s"]
    assert b.compute_s > 0


def test_live_capture_writes_tensorboard_and_perfetto_traces(tmp_path):
    program = jax.jit(lambda x: jnp.sin(x @ x).sum())
    x = jnp.ones((128, 128))
    program(x).block_until_ready()
    with profile_step(tmp_path, 3):
        program(x).block_until_ready()
    path = trace_file(tmp_path)
    assert list(path.parent.glob("*.trace.json.gz")), "no Perfetto trace beside the xplane"
    b = step_breakdown(load_trace(path), 3)
    assert b.devices == 1 and b.compute_s > 0 and b.network_s == 0
    assert b.compute_s + b.host_s == pytest.approx(b.step_s)


def test_step_profiler_captures_only_its_steps(tmp_path):
    from locoexp.metrics.breakdown import StepProfiler

    profiler = StepProfiler(tmp_path, frozenset({1}), role="rollout", index=2)
    program = jax.jit(lambda x: (x * 2).sum())
    for step in range(3):
        with profiler.capture(step):
            program(jnp.ones(64)).block_until_ready()
    assert [p.name for p in (tmp_path / "profile").iterdir()] == ["step1"]
    assert profiler.log_dir(1) == tmp_path / "profile" / "step1" / "rollout2"
    assert profiler.metrics(0) == {}
    shares = profiler.metrics(1)
    assert sum(shares[f"breakdown/{k}_share"] for k in ("compute", "network", "host")) == (
        pytest.approx(1.0)
    )


def test_an_asynchronous_cpu_op_lasts_until_its_linked_end_event():
    # XLA:CPU: the op's event covers its launch [200, 210); `end: fusion.7` with the same flow id
    # ends it at 700. An end event of another flow id does not extend it.
    profile = xspace(
        [
            ("python", STEP_ANNOTATION, 100, 1000, {"step_num": 0}),
            ("t0", "fusion.7", 200, 10, {"hlo_op": "fusion.7", "device_ordinal": 0, "_p": 42}),
            ("t1", "end: fusion.7", 690, 10, {"_c": 42}),
            ("t0", "fusion.8", 800, 10, {"hlo_op": "fusion.8", "device_ordinal": 0, "_p": 43}),
            ("t1", "end: fusion.8", 1000, 10, {"_c": 99}),
        ]
    )
    b = step_breakdown(profile, 0)
    assert b.compute_s == pytest.approx(510e-9) and b.host_s == pytest.approx(490e-9)
