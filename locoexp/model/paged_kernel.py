"""Decode attention over the paged KV cache with JAX's ragged paged attention kernel (TPU).

The TPU half of issue 42's item 2: the Pallas (Mosaic) kernel
`jax.experimental.pallas.ops.tpu.ragged_paged_attention` (Ragged Paged Attention, Jiang et al.,
2026, the attention of the paper's engine, tpu-inference), beside the XLA path of
locoexp/model/paged.py that CPU and GPU run. It takes the pool in the layout that path already
keeps ([N, page, 2E, h], keys at even heads), each slot's page table and length, and one query
token per slot (`cu_q_lens` 0, 1, .., W: decode only).

A Mosaic kernel is a custom call XLA cannot partition, so it runs under `jax.shard_map` on each
device's own part of the engine's mesh (as the trainer's splash kernel, model/attention.py's
`on_own_rows`): the pool's replica axis over `data` (each replica's slots, W / r consecutive
rows, read only their replica's pages) and the heads over `tensor` (a device's query heads read
the cache heads it holds). No page, row or head crosses devices: no collective.

The kernel picks its block sizes from a table of tuned sizes keyed by `jax.devices()[0]`, which
on a machine compiling for a TPU without one is the CPU; `block_sizes` looks the same table up
by the target devices' `device_kind` instead; where a block's pages would not fit the kernel's
VMEM (`fit_vmem`, under the limit `vmem_limit` raises it to) the block is halved. Where the
kernel cannot take a layer's shapes (`unusable`: head_dim other than 128, which its Mosaic
lowering refuses, or heads it cannot tile), that layer runs the XLA path on TPU too, with a
stated reason: `dry_run=compile` prints `kernel_note` (Gemma4's 256- and 512-wide heads run the
XLA path). A fallback, not a refusal: the XLA path compiles and runs on TPU, and gives the same
tokens.

It owns the kernel's call only: no allocation, no writes into the pool (`paged.attend_paged`).

Shapes: W slots, r replicas, N pages per replica, page tokens a page, E cache heads, H query
heads, h head_dim, Q = most pages a slot holds.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes as tuned
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as PS

from locoexp.model.config import ModelConfig

Array = jax.Array
KERNEL_HEAD_DIM = 128  # Mosaic's strided k/v load: "The last dim size is not 128" otherwise


@dataclasses.dataclass(frozen=True)
class PagedKernel:
    """Run decode attention over the paged cache with the TPU kernel, on `mesh` (the engine's
    mesh of TPU devices), whose `data` axis splits the replicas and `tensor` axis the heads
    (other axes, an expert axis, hold copies)."""

    mesh: Mesh
    data: str
    tensor: str

    @property
    def device_kind(self) -> str:
        return self.mesh.devices.flat[0].device_kind

    def unusable(self, q_heads: int, cache_heads: int, head_dim: int, dtype) -> str | None:
        """Why the kernel cannot take a layer of `q_heads` query and `cache_heads` cache heads
        (split over the tensor axis), or None when it can."""
        t = self.mesh.shape[self.tensor]
        return unusable(q_heads // t, cache_heads // t, head_dim, dtype)


def paged_kernel_for(mesh: Mesh, *, data: str, tensor: str) -> PagedKernel | None:
    """The kernel where the engine's devices are TPUs (a TPU topology's too), else None: CPU and
    GPU keep the XLA path."""
    return PagedKernel(mesh, data, tensor) if mesh.devices.flat[0].platform == "tpu" else None


def unusable(q_heads: int, cache_heads: int, head_dim: int, dtype) -> str | None:
    """Why the kernel cannot take one device's layer ([.., q_heads, h] queries, a pool of
    2 * cache_heads combined heads), or None when it can."""
    if head_dim != KERNEL_HEAD_DIM:
        return f"head_dim {head_dim} (the kernel takes {KERNEL_HEAD_DIM} only)"
    try:
        rpa.get_min_heads_per_blk(q_heads, 2 * cache_heads, dtype, dtype)
    except ValueError as error:
        return f"{2 * cache_heads} combined KV heads per device ({error})"
    return None


def block_sizes(
    device_kind: str, dtype, q_heads: int, cache_heads: int, head_dim: int, page_tokens: int,
    slots: int, pages_per_slot: int,
) -> tuple[int, int]:  # fmt: skip
    """(num_kv_pages_per_block, num_queries_per_block) from the kernel's own tuned table
    (`tuned_block_sizes.TUNED_BLOCK_SIZES`, keyed by its `simplify_key`) for one device's call
    on a TPU of `device_kind`, as `get_tuned_block_sizes` looks them up on the TPU it runs on.
    The table has 'TPU v5' (v5e's "TPU v5 lite" and v5p) and 'TPU v6' only, and no entry for
    many head groupings (Qwen3-0.6B's 16 query and 8 KV heads a block, on every generation),
    so v7x ("TPU7x") and such calls take a default. The kernel's own (128 pages, 32 queries;
    32 pages on v4) copies 128 pages a block: a row of 160 pages of 16 tokens (GSM8K's caps)
    reads 256, and a 13-page row 128 (experiments/LOG.md, session 27: at GSM8K's length mix
    the paged iteration then read 12.1 GiB against the dense cache's 13.8). Every tuned entry
    of either table takes at most `MAX_PAGES_PER_SEQ` (16) pages a block, the bound the table's
    file gives for the kernel's scalar registers, so that is the default here (32 queries).
    Both are capped by the call's pages per slot and its queries (one a slot), as the kernel
    caps them."""
    q_block, kv_block = rpa.get_min_heads_per_blk(q_heads, 2 * cache_heads, dtype, dtype)
    key = tuned.simplify_key(
        (dtype, dtype, q_block, kv_block // 2, head_dim, page_tokens, slots, pages_per_slot)
    )
    name = " ".join(device_kind.split()[:2])  # "TPU v5 lite" -> "TPU v5"; "TPU7x" stays
    default = (tuned.MAX_PAGES_PER_SEQ, 32)  # the most pages any tuned entry takes
    pages, queries = tuned.TUNED_BLOCK_SIZES.get(name, {}).get(key, default)
    return min(pages_per_slot, pages), min(slots, queries)


def ragged_decode_attention(
    kernel: PagedKernel, q: Array, pool: Array, table: Array, lengths: Array, window: int = 0
) -> Array:
    """As `paged.paged_decode_attention`: q [W, H, h] of each slot's newest token, pool
    [r, N, page, 2E, h], table [W, Q] int32, lengths [W] int32 (>= 1) -> [W, H*h]; with
    `window` > 0 a token attends the `window` newest tokens (the kernel's `sliding_window`:
    key j is masked where (lengths - 1) - window >= j, so keys lengths - window .. lengths - 1
    remain, as the XLA path's `position >= lengths - window`)."""
    slots, heads, h = q.shape
    call = functools.partial(_one_device, kernel.device_kind, window=window)
    data, tensor = kernel.data, kernel.tensor
    on_own = jax.shard_map(
        call,
        mesh=kernel.mesh,
        in_specs=(PS(data, tensor), PS(data, None, None, tensor), PS(data), PS(data)),
        out_specs=PS(data, tensor),
        check_vma=False,
    )
    return on_own(q, pool, table, lengths).reshape(slots, heads * h)


def _one_device(
    device_kind: str, q: Array, pool: Array, table: Array, lengths: Array, *, window: int
) -> Array:
    """One device's kernel call: q [W/r, H/t, h], pool [1, N, page, 2E/t, h], its replica's
    table rows [W/r, Q] and lengths [W/r] -> [W/r, H/t, h]. A table entry past the pool (N: a
    column the slot does not hold) is clamped into it; the kernel never reads past a slot's
    length, and an idle slot's output is dropped by the caller."""
    slots, heads, h = q.shape
    pages = pool[0]
    count, page_tokens, combined = pages.shape[:3]
    per_block, queries = block_sizes(
        device_kind, pages.dtype, heads, combined // 2, h, page_tokens, slots, table.shape[1]
    )
    limit = vmem_limit()
    per_block = fit_vmem(pages, heads, per_block, queries, limit)
    out = rpa.ragged_paged_attention(
        q.astype(pages.dtype),
        pages,
        lengths,
        jnp.minimum(table, count - 1),
        jnp.arange(slots + 1, dtype=jnp.int32),  # one query token a slot
        jnp.array([slots], jnp.int32),
        sm_scale=h**-0.5,
        sliding_window=window or None,
        num_kv_pages_per_block=per_block,
        num_queries_per_block=queries,
        vmem_limit_bytes=limit,
    )
    return out.astype(q.dtype)


def vmem_limit() -> int:
    """The kernel's scoped VMEM limit on the TPU traced for (inside `shard_map` or
    `jax.set_mesh` of its devices): 3/4 of a core's VMEM (v5e and v6e 96 MiB, v7x 48 MiB). The
    compiler's default scope is smaller: the kernel's default block (128 pages) for
    Qwen3-0.6B's float32 pool on v5e, 32 MiB of double-buffered pages, failed to compile with
    it ("CompileTimeScopedVmemOom"); tpu-inference raises its kernel's limit likewise."""
    return pltpu.get_tpu_info().vmem_capacity_bytes * 3 // 4


def fit_vmem(
    pages: Array | jax.ShapeDtypeStruct, q_heads: int, per_block: int, queries: int, limit: int
) -> int:
    """`per_block` pages a kv block, halved until the kernel's blocks fit `limit` bytes."""
    while per_block > 1 and _vmem_bytes(pages, q_heads, per_block, queries) > limit:
        per_block //= 2
    return per_block


def _vmem_bytes(
    pages: Array | jax.ShapeDtypeStruct, q_heads: int, per_block: int, queries: int
) -> int:
    """VMEM the kernel's blocks take (kernel.py's scratch and blocks): the double-buffered kv
    pages of a heads block, q and out blocks (each double-buffered), the float32 accumulator
    and the softmax's l and m rows (128 lanes each)."""
    _, page_tokens, combined, h = pages.shape
    item = pages.dtype.itemsize
    q_block, kv_block = rpa.get_min_heads_per_blk(q_heads, combined, pages.dtype, pages.dtype)
    rows = queries * q_block // (kv_block // 2)  # queries x query heads a KV head
    kv = 2 * per_block * page_tokens * kv_block * h * item
    q_and_out = 2 * 2 * queries * q_block * h * item
    return kv + q_and_out + queries * q_block * h * 4 + 2 * (kv_block // 2) * rows * 128 * 4


def kernel_note(model: ModelConfig, tensor_parallel: int, dtype) -> str:
    """Which of `model`'s layers a TPU engine of `tensor_parallel` devices a replica, in
    `dtype`, runs with the kernel, and why the others run the XLA path (one sentence)."""
    reasons: dict[str, list[int]] = {}
    for layer in range(model.num_layers):
        kv_heads, head_dim = model.layer_kv_shape(layer)
        cache = max(kv_heads, tensor_parallel)  # a repeated KV head per device past the heads
        q, e = model.num_heads // tensor_parallel, cache // tensor_parallel
        reason = unusable(q, e, head_dim, dtype)
        if reason:
            reasons.setdefault(reason, []).append(layer)
    used = model.num_layers - sum(len(layers) for layers in reasons.values())
    note = f"decode attention over pages: the ragged paged attention kernel on {used} of "
    note += f"{model.num_layers} layers"
    for reason, layers in reasons.items():
        note += f"; the XLA path on {len(layers)}: {reason}"
    return note
