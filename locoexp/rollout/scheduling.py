"""How the JAX engine runs its slot programs (locoexp/rollout/decode.py) over a call's requests.

`rollout.scheduler` chooses (`Scheduler`, dispatched in `generate_slots`):
- `waves`: the requests are cut into waves of W slots; each wave is prefilled, then decoded
  until its longest row ends, finished rows computed to the end (the paper's "two waves at 8
  chips", Appendix E).
- `continuous`: W slots take requests 0..W-1; when a row ends its slot takes the next waiting
  request on device (prefill into the slot's cache rows, no host round trip), so every slot
  decodes while requests wait (App. G: "decodes a step's 32 rows in one continuous batch").
  Once nothing waits and at most half of every replica's slots are live, the loop returns to
  the host, which reads the live counts (one host read per width change, at most log2(W) per
  call) and gathers each replica's live slots into the narrowest width whose share per replica
  holds the busiest one's, on the replica's own devices; finished rows are not decoded at full
  width through a step's tail.

Each width compiles its programs once (widths W, W/2, ... down to one slot per replica, in whole
replicas). Programs are compiled before their clocks start: `prefill_s` holds the first fill,
`decode_s` the decode loops, with continuous batching's refill prefills and compactions in it.

It owns the host loop only: no model code, no weights.
"""

import dataclasses
import functools
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as PS

from locoexp.model.moe import expert_mesh
from locoexp.model.paged_kernel import paged_kernel_for
from locoexp.rollout import decode as programs
from locoexp.rollout import sharding
from locoexp.rollout.config import Scheduler
from locoexp.rollout.paged_slots import PagedCache, PageLayout
from locoexp.rollout.pages import Pages


@dataclasses.dataclass(frozen=True)
class Generated:
    """Outputs by request (host arrays) and what the programs counted."""

    tokens: np.ndarray  # [N, M] int32
    logprobs: np.ndarray  # [N, M] float32
    lengths: np.ndarray  # [N] int32
    decode_iterations: int
    live_slot_iterations: int  # live rows summed over decode iterations
    slot_iterations: int  # computed rows (the width) summed over decode iterations
    refills: int
    waves: int
    prefill_s: float
    decode_s: float
    # rollout.kv_cache=paged: pages still held once every request ended, summed over replicas
    # and waves (a page the allocator lost; 0 unless it leaks); 0 for the dense cache
    pages_held_at_end: int = 0


@dataclasses.dataclass(frozen=True)
class Call:
    """One generate call's static settings (each distinct value compiles its programs once)."""

    prompt_len: int  # P
    max_new: int  # M
    chunk: int
    sampling: object  # engine.SamplingParams (hashable)


# Narrowest compaction width per replica: below a few rows a decode iteration costs about the
# same at any width (it reads every weight once; tools/bench_variable_lengths.py measures the
# per-iteration time by width), and each width compiles its own programs.
NARROWEST_ROWS_PER_REPLICA = 4


def slot_widths(width: int, replicas: int) -> list[int]:
    """Compaction widths, widest first: halving, in whole replicas, down to
    `NARROWEST_ROWS_PER_REPLICA` rows per replica."""
    widths, narrowest = [width], NARROWEST_ROWS_PER_REPLICA * replicas
    while widths[-1] > narrowest:
        half = -(-widths[-1] // 2)
        widths.append(-(-half // replicas) * replicas)
    return widths


class SlotPrograms:
    """The compiled programs of one engine, by shape, with its mesh's layouts at their edges."""

    def __init__(
        self, graphdef, mesh: Mesh, *, layers: int, cache_heads: int, vocab_shards: int, eos_id,
        pad_id, paged: PageLayout | None = None, moe: bool = False,
    ):  # fmt: skip
        """paged: the slots keep a paged cache of this layout (`rollout.kv_cache=paged`); moe:
        the model is a mixture of experts (each replica routes its own slots, `traced`)."""
        self.graphdef, self.mesh, self.layers, self.paged = graphdef, mesh, layers, paged
        self.cache_heads, self.eos_id, self.pad_id = cache_heads, eos_id, pad_id
        self.vocab_shards = vocab_shards
        self.moe = moe
        self.replicated = NamedSharding(mesh, PS())
        # a paged cache on TPU attends with the ragged paged attention kernel (issue 42)
        self.paged_kernel = paged_kernel_for(mesh, data=sharding.DATA, tensor=sharding.TENSOR)
        self._compiled: dict[tuple[str, tuple[Any, ...]], jax.stages.Compiled] = {}

    @property
    def replicas(self) -> int:
        return self.mesh.shape[sharding.DATA]

    def traced(self):
        """The context the programs are traced in: a mixture of experts' layers find the
        expert axis and route each data-parallel replica's own slots (`moe.expert_mesh`)."""
        return expert_mesh(self.mesh, (sharding.DATA,) if self.moe else ())

    def program(self, kind: str, static: tuple, *args):
        """The compiled `kind` program of `static` settings, compiled on first use."""
        if (kind, static) not in self._compiled:
            with self.traced():
                lowered = self.jit(kind, static).lower(*args)
            self._compiled[kind, static] = lowered.compile()
        return self._compiled[kind, static]

    def jit(self, kind: str, static: tuple):
        """`start` (static: call, width, requests), `compact` (call, width, requests, the width
        compacted from), `run` (call, width, requests, floor, refill) or `iteration` (call,
        width, requests: one decode iteration)."""
        call, width = static[0], static[1]
        sampler = dict(sampling=call.sampling, eos_id=self.eos_id, vocab_shards=self.vocab_shards)
        out = self._slot_shardings()
        match kind:
            case "start":
                fn = functools.partial(
                    programs.start, self.graphdef, width=width, chunk=call.chunk,
                    max_new=call.max_new, cache_heads=self.cache_heads, pad_id=self.pad_id,
                    paged=self.paged, replicas=self.replicas, **sampler,
                )  # fmt: skip
                return jax.jit(fn, out_shardings=out)
            case "run":  # the slots are donated: the loop updates their cache in place
                fn = functools.partial(
                    programs.run, self.graphdef, floor=static[3], refill=static[4],
                    replicas=self.replicas, chunk=call.chunk, cache_heads=self.cache_heads,
                    **self._paging(), **sampler,
                )  # fmt: skip
                return jax.jit(fn, out_shardings=out, donate_argnums=(1,))
            case "iteration":  # one decode iteration alone (its figures: `iteration`)
                fn = functools.partial(
                    programs.iteration, self.graphdef, replicas=self.replicas,
                    **self._paging(), **sampler,
                )  # fmt: skip
                return jax.jit(fn, out_shardings=out, donate_argnums=(1,))
            case "compact":
                fn = functools.partial(programs.compact, width=width, replicas=self.replicas)
                if self.paged:  # the pools go in apart and donated (`compact_args`)
                    fn = functools.partial(_compact_beside_pools, fn)
                    return jax.jit(fn, out_shardings=out, donate_argnums=(0,))
                return jax.jit(fn, out_shardings=out)
        raise ValueError(f"no slot program {kind!r}")

    def compact_args(self, state: programs.Slots) -> tuple:
        """The compact program's arguments. A paged cache's pools are the slots' largest arrays
        and a compaction only moves page-table rows, so they go in as an argument of their own,
        donated, and come back in place (aliased); passed inside the slots, XLA laid out a copy
        of every pool beside them (XLA-TPU, Qwen3-0.6B NuminaMath on v7x: the compact
        program's arguments and outputs 1.49 + 1.49 GiB at 2 layers, no alias; experiments/
        LOG.md, session 27). A dense cache narrows every array: nothing to hand back."""
        if not self.paged:
            return (state,)
        cache = state.cache
        assert isinstance(cache, PagedCache)
        return cache.pools, state._replace(cache=cache._replace(pools=()))

    def _paging(self) -> dict[str, Any]:
        """The decode programs' paged-cache settings (none for the dense cache)."""
        if self.paged is None:
            return dict(page_tokens=0, paged_kernel=None)
        return dict(page_tokens=self.paged.page_tokens, paged_kernel=self.paged_kernel)

    def _slot_shardings(self) -> programs.Slots:
        rows, cache = (
            NamedSharding(self.mesh, PS(sharding.DATA)),
            sharding.cache_sharding(self.mesh),
        )
        if self.paged is None:
            caches: object = tuple((cache, cache) for _ in range(self.layers))
        else:  # pools split by replica over data and by heads over tensor; the rest by replica
            # the same pytrees holding shardings, which their annotations (arrays) do not say
            pool = sharding.pool_sharding(self.mesh)
            pages = Pages(free=rows, top=rows, table=rows, held=rows, granted=rows)  # type: ignore[arg-type]
            caches = PagedCache(pools=(pool,) * self.layers, pages=pages, parked=rows)  # type: ignore[arg-type]
        leaves = dict(
            request=rows,
            length=rows,
            prompt_len=rows,
            last=rows,
            pending=rows,
            fresh=rows,
            waiting=self.replicated,
            tokens=self.replicated,
            logprobs=self.replicated,
            lengths=self.replicated,
            counts=self.replicated,
            key=self.replicated,
        )
        # the carry's structure holding shardings, which its annotations (arrays) do not say
        return programs.Slots(cache=caches, **leaves)  # type: ignore[arg-type]


@dataclasses.dataclass
class _Clock:
    prefill_s: float = 0.0
    decode_s: float = 0.0

    def timed(self, phase: str, program, *args):
        """Run a compiled program to completion, adding its seconds to `phase`."""
        begin = time.perf_counter()
        out = jax.block_until_ready(program(*args))
        setattr(self, phase, getattr(self, phase) + time.perf_counter() - begin)
        return out


def generate_slots(
    slots: SlotPrograms,
    params,
    requests: programs.Requests,
    *,
    key: jax.Array,
    call: Call,
    width: int,
    scheduler: Scheduler,
) -> Generated:
    """Every request's completion (host `requests`, `first` 0), by `scheduler` over `width`
    slots."""
    match scheduler:
        case Scheduler.waves:
            return _waves(slots, params, requests, key=key, call=call, width=width)
        case Scheduler.continuous:
            return _continuous(slots, params, requests, key=key, call=call, width=width)


def _start(slots: SlotPrograms, params, requests, key, call: Call, width: int, clock: _Clock):
    placed = jax.device_put(requests, slots.replicated)
    static = (call, width, len(requests.caps))
    program = slots.program("start", static, params, placed, key)
    return clock.timed("prefill_s", program, params, placed, key), placed, static


def _run(slots: SlotPrograms, params, state, placed, static, floor, refill, clock: _Clock):
    program = slots.program("run", (*static, floor, refill), params, state, placed)
    return clock.timed("decode_s", program, params, state, placed)


def _waves(slots: SlotPrograms, params, requests, *, key, call: Call, width: int) -> Generated:
    """Waves of `width` rows (the last padded with its first request, whose copies are
    dropped), each decoded until its longest row ends."""
    n, clock, parts, held = len(requests.caps), _Clock(), [], 0
    for first in range(0, n, width):
        rows = np.arange(first, first + width)
        rows = np.where(rows < n, rows, first)
        wave = host_requests(
            requests.prompts[rows], requests.prompt_lens[rows], requests.caps[rows], first=first
        )
        state, placed, static = _start(slots, params, wave, key, call, width, clock)
        state = _run(slots, params, state, placed, static, 0, False, clock)
        held += _pages_held(state)
        parts.append(jax.device_get((state.tokens, state.logprobs, state.lengths, state.counts)))
    cat = lambda i: np.concatenate([p[i] for p in parts])[:n]
    counts = np.sum([p[3] for p in parts], axis=0)
    return _generated(cat(0), cat(1), cat(2), counts, waves=len(parts), clock=clock, held=held)


def _continuous(slots: SlotPrograms, params, requests, *, key, call: Call, width: int):
    """`width` slots refilled on device while requests wait, then narrowed as rows end."""
    clock, total = _Clock(), len(requests.caps)
    widths = slot_widths(width, slots.replicas)
    state, placed, static = _start(slots, params, requests, key, call, width, clock)
    while True:
        narrower = [w for w in widths if w < static[1]]
        floor = narrower[0] if narrower else 0
        state = _run(slots, params, state, placed, static, floor, True, clock)
        live = (np.asarray(state.request) < total).reshape(slots.replicas, -1).sum(axis=1)
        if not floor or not live.any():
            break
        source = static[1]  # each replica keeps its own rows: the busiest one sets the width
        static = (call, min(w for w in narrower if w // slots.replicas >= live.max()), total)
        # keyed by the width compacted from too: 16 -> 4 and 8 -> 4 take different inputs
        args = slots.compact_args(state)
        program = slots.program("compact", (*static, source), *args)
        state = clock.timed("decode_s", program, *args)
    tokens, logprobs, lengths, counts = jax.device_get(
        (state.tokens, state.logprobs, state.lengths, state.counts)
    )
    held = _pages_held(state)
    return _generated(tokens, logprobs, lengths, counts, waves=1, clock=clock, held=held)


def _pages_held(state: programs.Slots) -> int:
    """Pages of a paged cache not back in their replica's free list (0 for a dense cache)."""
    if not isinstance(state.cache, PagedCache):
        return 0
    pages = state.cache.pages
    top = np.asarray(pages.top)
    return int(pages.free.shape[-1] * top.size - top.sum())


def _generated(
    tokens, logprobs, lengths, counts, *, waves: int, clock: _Clock, held: int
) -> Generated:
    iterations, live, computed, refills = (int(x) for x in counts)
    return Generated(
        tokens=tokens,
        logprobs=logprobs,
        lengths=lengths,
        decode_iterations=iterations,
        live_slot_iterations=live,
        slot_iterations=computed,
        refills=refills,
        waves=waves,
        prefill_s=clock.prefill_s,
        decode_s=clock.decode_s,
        pages_held_at_end=held,
    )


def host_requests(
    prompts: np.ndarray, prompt_lens: np.ndarray, caps: np.ndarray, *, first: int
) -> programs.Requests:
    """`Requests` of host arrays ([R, P], [R], [R] int32), placed by the jitted call that takes
    them (its annotations say device arrays)."""
    return programs.Requests(prompts, prompt_lens, caps, np.int32(first))  # type: ignore[arg-type]


def _compact_beside_pools(compact, pools, slots: programs.Slots) -> programs.Slots:
    """`compact` of slots whose paged cache's pools came in apart (`SlotPrograms.compact_args`):
    the pools are handed back as they came, which their donation lets XLA do in place."""
    narrowed = compact(slots)
    return narrowed._replace(cache=narrowed.cache._replace(pools=pools))
