"""XLA for TPU decides what fits (`dry_run=compile`, locoexp/compiled): a run's programs compile
for a TPU slice's devices from libtpu's topology, on this CPU machine, and the verdict is XLA's.

These compile for real with XLA-TPU (libtpu comes with the test extra); nothing is allocated
on a TPU and nothing runs. The compile of a Qwen3-0.6B-shaped cell takes about a minute on two
cores.

The three whole cells (`run.py ... dry_run=compile`) are `slow` and each its own xdist group
(conftest.py): minutes of one core each, they start first and run beside the suite's other
modules instead of one after another on one worker. (Sharing one compile child between the
two v5e cells, asked in-process, saved 5 of their 173 CPU-seconds: the compiles are the cost,
not JAX's and libtpu's start.)
"""

import dataclasses
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as PS

from locoexp.compiled import topology
from locoexp.compiled.programs import ProgramMemory, trainer_scans
from locoexp.compiled.verdict import at_depth, cuts_on_a_line, layer_cuts, run_shapes
from locoexp.compose import compose_config
from locoexp.errors import ConfigError
from locoexp.model.attention import AttentionSpec, attend
from locoexp.model.config import AttentionKind

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]
GENERATIONS = ["tpu_v5e_4", "tpu_v6e_4", "tpu_v7x_4"]


def run_py(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "run.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("preset", GENERATIONS)
def test_the_splash_kernel_compiles_for_every_tpu_generation(preset):
    """trainer.attention=splash as the FSDP step calls it (each device on its own rows) compiles
    to a Mosaic kernel for v5e, v6e and v7x: compiled, not only lowered."""
    hardware = compose_config([f"hardware={preset}"]).hardware
    devices = topology.topology_devices(hardware)
    mesh = Mesh(np.array(devices), ("fsdp",))
    spec = AttentionSpec(kind=AttentionKind.splash, rows=NamedSharding(mesh, PS("fsdp")))
    rows, tokens = len(devices), 1024
    placed = NamedSharding(mesh, PS("fsdp"))
    q = jax.ShapeDtypeStruct((rows, tokens, 8, 128), jnp.bfloat16, sharding=placed)
    kv = jax.ShapeDtypeStruct((rows, tokens, 2, 128), jnp.bfloat16, sharding=placed)
    seg = jax.ShapeDtypeStruct((rows, tokens), jnp.int32, sharding=placed)
    loss = lambda q, k, v, s: attend(spec, q, k, v, s).astype(jnp.float32).sum()  # noqa: E731
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv, seg)
    assert lowered.as_text().count("tpu_custom_call") >= 2  # forward and backward kernels
    compiled = lowered.compile()  # XLA-TPU's executable holds the Mosaic kernels
    assert compiled.as_text().count("tpu_custom_call") >= 2


@pytest.mark.slow
@pytest.mark.xdist_group("compiled_tpu_qwen3_cell")
def test_a_qwen3_0_6b_gsm8k_cell_compiles_for_tpu_v7x_8_and_fits():
    """Qwen3-0.6B's layer shapes (vocabulary, width, heads; 1 of its 28 layers: the compile
    grows by a layer's worth per layer) on GSM8K's prompt cap, co on tpu_v7x_8: the FSDP train
    step with the splash kernel, the engine's prefill and decode, and the publication
    compile for TPU, the verdict is XLA's, and each role's peak is within 10% of the plan's."""
    result = run_py(
        "model=qwen3_0_6b",
        "model.num_layers=1",
        "dataset=gsm8k",
        "dataset.prompts_per_step=2",  # 8 rows
        "dataset.samples_per_prompt=4",
        # XLA-TPU's compile of the train step grows with the step's tokens (experiments/LOG.md,
        # sessions 31 and 32): 47 s at 512 new tokens, 60 at GSM8K's 2,048 on a quiet 2-core
        # machine, the same programs otherwise
        "dataset.max_new_tokens=512",
        "hardware=tpu_v7x_8",
        "trainer.attention=splash",
        "dry_run=compile",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "compiled for tpu7x:2x2x2 (16 devices) with XLA for TPU" in out, out
    for program in ("train_step", "publish", "prefill", "decode"):
        assert f" {program} " in out, out
    assert "fits (XLA)" in out and "does not fit" not in out, out
    assert "Failed to find host bounds" not in result.stderr  # libtpu's warnings kept off
    roles = re.search(
        r"XLA: trainer ([\d.]+) GiB \(plan ([\d.]+)\), engine ([\d.]+) GiB \(plan ([\d.]+)\)", out
    )
    assert roles, out
    trainer, trainer_plan, engine, engine_plan = map(float, roles.groups())
    assert trainer == pytest.approx(trainer_plan, rel=0.10), out
    assert engine == pytest.approx(engine_plan, rel=0.10), out


def test_sizes_are_read_at_the_models_depth_on_the_line_through_two_cuts():
    """Each size at the model's layer count is on the line through the two compiled cuts."""
    two = ProgramMemory("trainer", "train_step", 100.0, 10.0, 10.0, 1000.0, 1.0)
    four = ProgramMemory("trainer", "train_step", 140.0, 10.0, 10.0, 1800.0, 2.0)
    (full,) = at_depth([two], [four], (2, 4), 28)
    assert (full.argument, full.temp, full.seconds) == (620.0, 11400.0, 3.0)
    qwen = compose_config(["model=qwen3_0_6b"]).model
    assert layer_cuts(qwen) == (2, 4)
    assert layer_cuts(compose_config(["model=tiny_qwen"]).model) == (4,)  # compiled whole
    assert layer_cuts(compose_config(["model=gemma4_31b"]).model)[0] % 6 == 0  # whole periods


@pytest.mark.parametrize(
    ("overrides", "scans"),
    [
        (["model=qwen3_0_6b", "trainer.remat=block"], True),
        (["model=qwen3_0_6b", "trainer.remat=none"], False),
        (["model=tiny_gemma4_moe", "trainer.remat=block"], False),  # local and global blocks differ
    ],
)
def test_a_trainer_whose_blocks_are_one_scan_is_compiled_at_its_whole_depth(overrides, scans):
    """A scanned train step compiles in the time of one block (Qwen3-0.6B's GSM8K step on
    tpu_v7x_8: 121 s at 2 layers, 131 s at 28), so its sizes are read from the whole model,
    not from a line through cuts (experiments/LOG.md, session 24)."""
    assert trainer_scans(run_shapes(compose_config(overrides))) is scans


def test_a_program_xla_refuses_at_a_cut_is_off_the_line_and_compiles_whole():
    """Near the device's memory XLA-TPU rematerialises to fit, and a refusal names what it
    needs where it gave up: such cuts do not extrapolate, and the whole model compiles."""
    fits = ProgramMemory("trainer", "train_step", 1.0, 0.0, 0.0, 50.0, 1.0)
    refused = dataclasses.replace(fits, temp=90.0, refusal="Ran out of memory on HBM")
    assert cuts_on_a_line([fits], [fits])
    assert not cuts_on_a_line([fits], [refused])
    assert not cuts_on_a_line([refused], [refused])


@pytest.mark.slow
@pytest.mark.xdist_group("compiled_tpu_v5e_refusal")
def test_a_cell_that_does_not_fit_is_refused_with_xlas_figure_and_a_setting_that_fits():
    """A train step XLA-TPU cannot lay out on a v5e device (the paper's layout: every packed row
    at once) gets XLA's own refusal and figure; the plan's proposal (accumulate gradients over
    micro-batches) is compiled and named as the setting that fits."""
    result = run_py(
        "model=tiny",
        "dataset=gsm8k",
        "dataset.prompts_per_step=512",  # XLA-TPU runs out of v5e's 15.75 GiB in one shot
        "trainer.accumulate=false",
        "rollout.capacity=64",  # the engine's waves: its compiles are not what this test is about
        "hardware=tpu_v5e_4",
        "dry_run=compile",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    verdict = result.stdout.strip().splitlines()[-1]
    assert "does not fit (XLA): the trainer needs" in verdict, result.stdout
    assert "more than the device's 15.75" in verdict, verdict
    assert "exceeds available HBM (15.75G)" in verdict, verdict  # XLA's own sentence
    assert "it fits with trainer.accumulate=true (compiled:" in verdict, verdict


@pytest.mark.slow
def test_hardware_cpu_compiles_with_xla_for_cpu_and_a_slice_needs_libtpu(monkeypatch):
    result = run_py("dry_run=compile")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "compiled for cpu (1 devices) with XLA for CPU" in result.stdout, result.stdout
    assert "local processes together" in result.stdout and "fits (XLA)" in result.stdout
    no_topology = dataclasses.replace(
        compose_config(["hardware=tpu_v7x_8"]).hardware, topology=None
    )
    with pytest.raises(ConfigError, match=r"choose a hardware=tpu_\* preset"):
        topology.topology_name(no_topology)
    hardware = compose_config(["hardware=tpu_v7x_8"]).hardware
    monkeypatch.setattr(topology, "libtpu_installed", lambda: False)
    with pytest.raises(ConfigError, match=r'pip install "jax\[tpu\]==0.10.2"'):
        topology.topology_devices(hardware)


def test_a_topology_that_contradicts_the_hosts_is_refused():
    with pytest.raises(ConfigError, match="hardware.topology=2x2x1 has 4 chips"):
        compose_config(["hardware=tpu_v7x_8", "hardware.topology=2x2x1"])


def test_every_tpu_preset_names_a_topology_libtpu_knows():
    """v5e, v5p, v6e and v7x from 4 to 256 chips: libtpu lays each out with the preset's
    devices and devices per host."""
    from locoexp.compose import group_options  # noqa: PLC0415

    presets = [p for p in group_options("hardware") if p.startswith("tpu_")]
    assert len(presets) == 28
    for preset in presets:
        hardware = compose_config(
            [
                f"hardware={preset}",
                "dataset.prompts_per_step=256",
                "dataset.synthetic.held_out_size=64",
            ]
        ).hardware
        assert len(topology.topology_devices(hardware)) == hardware.devices, preset


@pytest.mark.parametrize("chip", ["v5e", "v5p", "v6e", "v7x"])
def test_each_presets_memory_is_what_xla_tpu_lays_programs_out_in(chip):
    """memory_per_device_gib of every preset of a chip is the HBM XLA-TPU reports available on
    its devices (v7x: the paper's 94.7 GiB, XLA's 94.75)."""
    hardware = compose_config([f"hardware=tpu_{chip}_4"]).hardware
    available = topology.available_hbm_gib(topology.topology_devices(hardware)[0])
    assert hardware.memory_per_device_gib == pytest.approx(available, abs=0.06)


@pytest.mark.slow
@pytest.mark.xdist_group("compiled_tpu_moe_cell")
def test_a_mixture_of_experts_cell_compiles_its_expert_parallel_layers():
    """The trainer's `expert` mesh axis (EP2) and the engine's expert-parallel replica compile
    for TPU inside the step and the engine's programs."""
    result = run_py(
        "model=tiny_qwen3_moe",
        "hardware=tpu_v5e_4",
        "trainer.expert_parallel=2",
        "dataset.prompts_per_step=4",  # 16 rows: the same layers and mesh axes, a third the compile
        "dataset.samples_per_prompt=4",
        "dry_run=compile",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for program in ("train_step", "publish", "prefill", "decode"):
        assert f" {program} " in result.stdout, result.stdout
    assert result.stdout.strip().endswith("fits (XLA)"), result.stdout


def test_the_lora_merge_compiles_for_the_trainers_devices():
    """adapter=lora: publication starts from the merge W + s A B, compiled on the trainer's
    mesh of a v5e slice from the abstract adapters and frozen base."""
    from locoexp.compiled.programs import build_trainer, state_bytes  # noqa: PLC0415
    from locoexp.compiled.verdict import run_shapes  # noqa: PLC0415

    config = compose_config(["adapter=lora", "hardware=tpu_v5e_4", "dry_run=compile"])
    shapes = run_shapes(config)
    devices = topology.topology_devices(config.hardware)
    trainer = build_trainer(shapes, shapes.model, devices)
    compiled = trainer.lower_merge().compile()
    merged = compiled.memory_analysis().output_size_in_bytes
    # the policy, FSDP-sharded: no less than its shards (TPU pads tiny shards to (8, 128) tiles)
    assert state_bytes(trainer.policy_shapes) <= merged < 4 * state_bytes(trainer.policy_shapes)
