"""The paged cache's TPU decode attention (locoexp/model/paged_kernel.py, issue 42 item 2): JAX's
ragged paged attention kernel inside the engine's decode program, compiled with XLA-TPU for v5e,
v6e and v7x from libtpu's topologies (no TPU: compiled, never run), on each device's own
replica and heads; its block sizes from the kernel's tuned table by the target's device kind.

The kernel's numerics against the XLA path are in test_paged_attention.py (its reference
implementation: the kernel itself has no interpret mode that runs it, see that test).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes as tuned
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as PS
from test_compiled_tpu import run_py

from locoexp.compiled import programs, topology
from locoexp.compiled.verdict import run_shapes
from locoexp.compose import compose_config
from locoexp.model import paged_kernel

# A tiny model whose heads the kernel takes (head_dim 128), at a few rows: each compile ~10 s
TINY_128 = ["model=tiny", "model.head_dim=128", "dataset.prompts_per_step=2"]
TINY_128 += ["dataset.samples_per_prompt=4", "rollout.kv_cache=paged"]
_COLLECTIVE = re.compile(
    r"= (\S+) (?:all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter)(?:-start)?\("
)


def _elements(shape: str) -> int:
    """Elements of an HLO result like f32[4,1,128]{...} or a tuple's first array."""
    dims = re.search(r"\[([\d,]*)\]", shape)
    return eval("*".join(dims.group(1).split(",")) or "1") if dims else 0  # noqa: S307


@pytest.mark.parametrize(
    ("preset", "tensor_parallel"), [("tpu_v5e_4", 1), ("tpu_v6e_4", 2), ("tpu_v7x_4", 2)]
)
@pytest.mark.slow
def test_the_paged_decode_program_compiles_the_kernel_for_every_tpu_generation(
    preset, tensor_parallel
):
    """The engine's decode loop with rollout.kv_cache=paged compiles for v5e (DP4), v6e
    (DP2 x TP2) and v7x (8 devices: DP4 x TP2) with one ragged paged attention kernel a layer,
    and no collective carries as much as one page of one layer's pool on a device (the kernel
    reads each replica's own pages and each device's own heads)."""
    config = compose_config(
        [*TINY_128, f"hardware={preset}", f"rollout.tensor_parallel={tensor_parallel}"]
    )
    shapes = run_shapes(config)
    _, devices = programs.role_devices(shapes, topology.topology_devices(config.hardware))
    engine = programs.build_engine(shapes, shapes.model, devices)
    assert engine.slot_programs.paged_kernel is not None
    with engine.slot_programs.traced():
        text = programs.engine_lowerings(shapes, engine)["decode"]().compile().as_text()
    assert text.count("tpu_custom_call") == config.model.num_layers, text[-2000:]
    kernel_calls = [line for line in text.splitlines() if "ragged_paged_attention" in line]
    assert kernel_calls
    heads = 2 * max(config.model.num_kv_heads, tensor_parallel) // tensor_parallel
    page = config.rollout.page_tokens * heads * config.model.head_dim
    shapes_moved = [_elements(m.group(1)) for m in _COLLECTIVE.finditer(text)]
    assert max(shapes_moved, default=0) < page, shapes_moved


def test_block_sizes_come_from_the_kernels_table_by_the_target_device_kind(monkeypatch):
    """The tuned sizes are looked up for the TPU compiled for, never for jax.devices() (the
    CPU here): v6e's entry where the table has one; on v7x (no 'TPU7x' entry) and for
    Qwen3-0.6B's 16 query and 8 KV heads a block (not in the table) the most pages any tuned
    entry takes (16), not the kernel's 128, which reads up to a 128-page block a row."""
    monkeypatch.setattr(jax, "devices", lambda *a: pytest.fail("read jax.devices()"))
    args = (jnp.bfloat16, 8, 1, 128, 16, 512, 16)  # q heads, cache heads, h, page, W, Q
    key = tuned.simplify_key((jnp.bfloat16, jnp.bfloat16, 8, 1, 128, 16, 512, 16))
    assert paged_kernel.block_sizes("TPU v6 lite", *args) == tuned.TUNED_BLOCK_SIZES["TPU v6"][key]
    assert paged_kernel.block_sizes("TPU v5 lite", *args) == tuned.TUNED_BLOCK_SIZES["TPU v5"][key]
    assert paged_kernel.block_sizes("TPU7x", *args) == (16, 32)
    assert paged_kernel.block_sizes("TPU7x", *args[:-1], 8) == (8, 32)  # capped by Q
    largest = max(p for table in tuned.TUNED_BLOCK_SIZES.values() for p, _ in table.values())
    assert largest == tuned.MAX_PAGES_PER_SEQ == 16
    qwen = (jnp.bfloat16, 16, 8, 128, 16, 64, 160)  # GSM8K's caps: 160 pages a row
    assert paged_kernel.block_sizes("TPU v6 lite", *qwen) == (16, 32)


def test_qwen3_0_6b_float32_pages_at_numinamath_caps_compile_on_v5e():
    """The kernel's default block (128 pages) of Qwen3-0.6B's float32 pool is 32 MiB of
    double-buffered pages: over the compiler's default scoped VMEM on v5e
    ("CompileTimeScopedVmemOom"), within the limit the call raises it to (3/4 of v5e's 128
    MiB), so it compiles at that block."""
    hardware = compose_config(["hardware=tpu_v5e_4"]).hardware
    device = topology.topology_devices(hardware)[0]
    mesh = Mesh(np.array([device]).reshape(1, 1), ("data", "tensor"))
    kernel = paged_kernel.PagedKernel(mesh, "data", "tensor")
    slots, pages = 32, 768  # 4,096 + 8,192 tokens a row in pages of 16
    at = NamedSharding(mesh, PS())
    pool = jax.ShapeDtypeStruct((1, slots * pages, 16, 16, 128), jnp.float32, sharding=at)
    q = jax.ShapeDtypeStruct((slots, 16, 128), jnp.float32, sharding=at)
    table = jax.ShapeDtypeStruct((slots, pages), jnp.int32, sharding=at)
    lengths = jax.ShapeDtypeStruct((slots,), jnp.int32, sharding=at)
    call = jax.jit(lambda *a: paged_kernel.ragged_decode_attention(kernel, *a))
    assert "tpu_custom_call" in call.lower(q, pool, table, lengths).compile().as_text()
    with jax.set_mesh(mesh):
        limit = paged_kernel.vmem_limit()
        one = jax.ShapeDtypeStruct(pool.shape[1:], pool.dtype)  # one device's pages
        assert paged_kernel.fit_vmem(one, 16, 128, 32, limit) == 128
        assert paged_kernel.fit_vmem(one, 16, 128, 32, 16 * 2**20) < 128  # the default scope
    assert limit == 96 * 2**20


def test_layers_the_kernel_cannot_take_are_named_with_the_reason():
    """Gemma4's 256- and 512-wide heads run the XLA path on TPU, and the note says why;
    Qwen3's 128-wide heads run the kernel on every layer."""
    qwen = compose_config(["model=qwen3_0_6b"]).model
    assert paged_kernel.kernel_note(qwen, 1, jnp.bfloat16).endswith("on 28 of 28 layers")
    gemma = compose_config(["model=gemma4_31b"]).model
    note = paged_kernel.kernel_note(gemma, 1, jnp.bfloat16)
    assert "kernel on 0 of 60 layers" in note
    assert "head_dim 256 (the kernel takes 128 only)" in note, note


@pytest.mark.slow
@pytest.mark.xdist_group("compiled_tpu_paged_cell")
def test_a_paged_tiny_run_compiles_for_tpu_v5e_with_dry_run_compile():
    """`run.py ... rollout.kv_cache=paged hardware=tpu_v5e_4 dry_run=compile`: every program of
    a paged run compiles for TPU (the trainer's step is most of its minute), the report names
    the kernel's layers, and XLA fits it."""
    result = run_py(*TINY_128, "hardware=tpu_v5e_4", "dry_run=compile")
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    for program in ("prefill", "decode"):
        assert f" {program} " in out, out
    assert "ragged paged attention kernel on 2 of 2 layers" in out, out
    assert out.strip().endswith("fits (XLA)"), out
