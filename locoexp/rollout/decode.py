"""The engine's compiled programs: fill W decode slots, decode them, refill or compact them.

A slot holds one request: its KV cache row (the left-padded prompt at slots [0, P), then one
slot per generated token), how many tokens it has generated and its last token. Three programs:
- `start` prefills requests 0..W-1 into W slots, in chunks of `chunk` tokens per sequence (one
  `fori_loop` iteration per chunk: attention scores are [W, H, chunk, P] per layer, never
  [P, P]; the cache is widened to S slots after) and samples each one's first token.
- `run` is a `lax.while_loop` of decode iterations, one token per slot, with no host round trip
  per token (the paper's Eq. 2 per-iteration terms are all device time). A slot whose request
  ends (EOS or its cap) is empty; with `refill` the loop prefills the next waiting request into
  it at once, one request per data-parallel replica at a time, on device (continuous batching:
  App. G's engines decode "a step's 32 rows in one continuous batch", as vLLM does), and the
  next iteration samples its first token with every other slot's. The loop
  returns to the host when no slot is live, or when nothing waits and at most `floor` slots
  are live in every replica's share.
- `compact` gathers each replica's live slots into a narrower width, so a step's tail is not
  decoded at full width (the engine then runs the `run` of that width).
Refill and compaction work on each data-parallel replica's own slots ([W] rows as [replicas,
W / replicas]), so no cache row crosses devices (`_per_replica`).
Static waves are the same programs with one wave's requests, no refill and floor 0.
With `rollout.kv_cache=paged` the slots' cache is a `PagedCache` (locoexp/rollout/
paged_slots.py): rows take pages as they grow and may wait for them or be preempted (parked)
when the pool runs dry; the programs branch on the cache's type at the points that module
names, and a parked slot is re-prefilled by the same refill rounds (under waves too).

Each request's token t is drawn with `fold_in(fold_in(key, request), t)`: the draws depend on
the request, never on its slot, wave or width, so both schedulers sample the same completions.

The programs are pure functions of (graphdef, params, arrays); they never know about devices,
meshes or scheduling (the engine compiles them with its shardings and chooses the widths).

Shapes: R requests, W slots, P padded prompt length (a whole number of chunks), M =
max_new_tokens, S = P + M cache slots, E cache heads, D width, V vocabulary.
"""

import functools
from typing import NamedTuple, cast

import jax
import jax.numpy as jnp
from flax import nnx

from locoexp.model.paged import PagedLayer
from locoexp.model.paged_kernel import PagedKernel
from locoexp.model.transformer import KVCache, Transformer, init_cache
from locoexp.rollout import paged_slots
from locoexp.rollout.paged_slots import PagedCache, PageLayout
from locoexp.rollout.sampling import sample_tokens

Array = jax.Array


class Requests(NamedTuple):
    """The requests a call generates for, constant through the loop."""

    prompts: Array  # [R, P] int32, left-padded
    prompt_lens: Array  # [R] int32
    caps: Array  # [R] int32: most new tokens for each (<= M)
    first: Array  # int32: the request id of row 0 (its PRNG stream: see the module note)


class Slots(NamedTuple):
    """The decode loop's carry. `request` is R in an empty slot."""

    cache: KVCache | PagedCache  # dense: [W, E, S, h] per layer
    request: Array  # [W] int32
    length: Array  # [W] int32: tokens its request has generated
    prompt_len: Array  # [W] int32
    last: Array  # [W] int32: its request's last token
    # [W] bool: refilled since the last decode iteration, its first token not yet sampled;
    # `fresh` [W, D] holds such a slot's last prompt hidden state (see `_decode_iteration`)
    pending: Array
    fresh: Array
    waiting: Array  # int32: the next request no slot has taken (R when none waits)
    tokens: Array  # [R, M] int32 by request, pad past each end
    logprobs: Array  # [R, M] float32, 0 past each end
    lengths: Array  # [R] int32: generated tokens, EOS included
    # int32 [4]: decode iterations, live slot-iterations, computed slot-iterations, refills
    counts: Array
    key: Array


def _sample_rows(sampling, key, request_ids, steps, logits, vocab_shards=1) -> tuple[Array, Array]:
    """Token `steps[i]` of request `request_ids[i]` from logits [n, V], each on its own key."""
    sample = functools.partial(
        sample_tokens, temperature=sampling.temperature, top_k=sampling.top_k,
        top_p=sampling.top_p, vocab_shards=vocab_shards,
    )  # fmt: skip
    keys = jax.vmap(lambda r, t: jax.random.fold_in(jax.random.fold_in(key, r), t))(
        request_ids, steps
    )
    token, logprob = jax.vmap(lambda k, x: sample(k, x[None]))(keys, logits)
    return token[:, 0], logprob[:, 0]


def _prefill_rows(model, prompts, prompt_lens, *, chunk, slots, heads) -> tuple[KVCache, Array]:
    """Left-padded prompts [n, P] -> a cache of `slots` slots and `heads` heads holding them,
    and the last position's hidden state [n, D]."""
    rows, prompt_len = prompts.shape
    pad = prompt_len - prompt_lens
    valid = jnp.arange(slots)[None, :] >= pad[:, None]  # [n, S]: False on the left padding

    def run_chunk(c, carry):
        cache, _ = carry
        start = c * chunk
        tokens = jax.lax.dynamic_slice_in_dim(prompts, start, chunk, axis=1)
        positions = jnp.maximum(start + jnp.arange(chunk)[None, :] - pad[:, None], 0)
        hidden, cache = model(tokens, positions, valid, cache, start)
        return cache, hidden[:, -1]

    cache = init_cache(model.config, rows, slots, heads=heads)
    last = jnp.zeros((rows, model.config.hidden_dim), jnp.dtype(model.config.param_dtype.value))
    return jax.lax.fori_loop(0, prompt_len // chunk, run_chunk, (cache, last))


def _record(s: Slots, slot_ids, request_ids, token, logprob, requests: Requests, sampling, eos_id):
    """Write the tokens sampled for `request_ids` (R = none) at their next column; a request
    that hit its cap or EOS leaves its slot (`slot_ids`, W = none) empty."""
    column = s.length[jnp.minimum(slot_ids, s.length.shape[0] - 1)]
    column = jnp.where(slot_ids < s.length.shape[0], column, 0)
    tokens = s.tokens.at[request_ids, column].set(token, mode="drop")
    logprobs = s.logprobs.at[request_ids, column].set(logprob, mode="drop")
    lengths = s.lengths.at[request_ids].set(column + 1, mode="drop")
    caps = requests.caps[jnp.minimum(request_ids, requests.caps.shape[0] - 1)]
    ended = column + 1 >= caps
    if not sampling.ignore_eos:
        ended |= token == eos_id
    gone = requests.caps.shape[0]
    return s._replace(
        request=s.request.at[slot_ids].set(jnp.where(ended, gone, request_ids), mode="drop"),
        length=s.length.at[slot_ids].set(column + (request_ids < gone), mode="drop"),
        last=s.last.at[slot_ids].set(token, mode="drop"),
        tokens=tokens,
        logprobs=logprobs,
        lengths=lengths,
    )


def _first_slots(
    cache, request, prompt_lens, fresh, key, *, total: int, max_new: int, pad_id: int
) -> Slots:
    """The slots `start` fills: `request` [W] in them, nothing generated yet."""
    width = request.shape[0]
    return Slots(
        cache=cache,
        request=request,
        length=jnp.zeros((width,), jnp.int32),
        prompt_len=prompt_lens,
        last=jnp.full((width,), pad_id, jnp.int32),
        pending=jnp.zeros((width,), bool),
        fresh=fresh,
        waiting=jnp.int32(min(width, total)),
        tokens=jnp.full((total, max_new), pad_id, jnp.int32),
        logprobs=jnp.zeros((total, max_new), jnp.float32),
        lengths=jnp.zeros((total,), jnp.int32),
        counts=jnp.zeros((4,), jnp.int32),
        key=key,
    )


def start(
    graphdef,
    params,
    requests: Requests,
    key,
    *,
    width,
    chunk,
    max_new,
    cache_heads,
    sampling,
    eos_id,
    pad_id,
    vocab_shards=1,
    paged: PageLayout | None = None,
    replicas=1,
) -> Slots:
    """Requests 0..W-1 prefilled into W slots (slots past R empty), first tokens sampled.
    `vocab_shards`: the devices the logits are split over by vocabulary (`sample_tokens`).
    With `paged` the prompts go into pages of the `replicas` pools, in slot order while they
    last; a slot whose prompt finds no pages is parked (re-prefilled by `run`)."""
    model = nnx.merge(graphdef, params)
    total, prompt_len = requests.prompts.shape
    rows = jnp.arange(width)
    taken = jnp.minimum(rows, total - 1)
    prompt_lens = requests.prompt_lens[taken]
    # prefilled over the prompt's P slots, then widened to the S = P + M the decode writes: a
    # chunk's scores are [W, H, chunk, P], not [W, H, chunk, S] (M / P times more, all masked)
    prompt_cache, last = _prefill_rows(
        model, requests.prompts[taken], prompt_lens, chunk=chunk, slots=prompt_len,
        heads=cache_heads,
    )  # fmt: skip
    request = jnp.where(rows < total, rows, total)
    if paged is None:
        widen = lambda c: jnp.pad(c, ((0, 0), (0, 0), (0, max_new), (0, 0)))
        cache, go = jax.tree.map(widen, prompt_cache), None
    else:
        cache, go = _paged_start(
            model, prompt_cache, jnp.where(rows < total, prompt_lens, 0), paged,
            row_tokens=prompt_len + max_new, heads=cache_heads, replicas=replicas,
        )  # fmt: skip
    fresh = jnp.zeros_like(last)
    slots = _first_slots(
        cache, request, prompt_lens, fresh, key, total=total, max_new=max_new, pad_id=pad_id
    )
    token, logprob = _sample_rows(
        sampling, key, requests.first + taken, jnp.zeros_like(rows), model.logits(last),
        vocab_shards,
    )  # fmt: skip
    slot_ids, request_ids = _going(go, request, total)
    slots = _record(slots, slot_ids, request_ids, token, logprob, requests, sampling, eos_id)
    return _release_ended(slots, total, replicas)


def _release_ended(s: Slots, total: int, replicas: int) -> Slots:
    """A paged cache's empty slots (their requests ended) give their pages back."""
    if not isinstance(s.cache, PagedCache):
        return s
    ended = s.request == total
    return s._replace(cache=paged_slots.release_ended(s.cache, ended, replicas=replicas))


def _paged_start(
    model: Transformer, prefilled: KVCache, lens: Array, paged: PageLayout, *, row_tokens: int,
    heads: int, replicas: int,
) -> tuple[PagedCache, Array]:  # fmt: skip
    """`start`'s paged cache: the W prefilled rows (`lens` [W] prompt tokens, 0 for an empty
    slot) written into pages in slot order, the slots that found none parked. Returns the
    cache and the slots that hold their prompt [W]."""
    width = lens.shape[0]
    cache = paged_slots.empty_cache(
        model.config, paged, replicas=replicas, width=width, row_tokens=row_tokens,
        heads=heads, dtype=prefilled[0][0].dtype,
    )  # fmt: skip
    local = jnp.broadcast_to(jnp.arange(width // replicas), (replicas, width // replicas))
    cache, got = paged_slots.write_prompts(
        cache, prefilled, local, lens.reshape(replicas, -1), replicas=replicas,
        page_tokens=paged.page_tokens,
    )  # fmt: skip
    return cache._replace(parked=(lens > 0) & ~got), got


def _going(go: Array | None, request: Array, total: int) -> tuple[Array, Array]:
    """(slot ids, request ids) `_record` writes for: every slot (`go` None: the dense cache's
    every slot decodes), else the slots in `go` only (W and R elsewhere: dropped)."""
    width = request.shape[0]
    if go is None:
        return jnp.arange(width), request
    return jnp.where(go, jnp.arange(width), width), jnp.where(go, request, total)


def _by_replica(x: Array, replicas: int) -> Array:
    """[W, ...] -> [replicas, W / replicas, ...]: replica j's slots are rows j*W/r.. of the
    engine's row-sharded arrays, so this leading axis is exactly the data axis's split."""
    return x.reshape(replicas, x.shape[0] // replicas, *x.shape[1:])


def _per_replica(fn, x: Array, *args, replicas: int) -> Array:
    """`fn(rows, *args)` on each replica's own [W / r, ...] rows (args with a leading [r] axis),
    put back as [W, ...]. The leading axis of the vmap is the data axis, so XLA keeps every
    replica's work on its own devices: written over the global [W] rows, a refill's scatter
    all-gathered every replica's prefilled cache rows to every device, and a compaction's
    gather all-reduced the whole narrower cache over the data axis (tests/test_engine_tp.py)."""
    return jax.vmap(fn)(_by_replica(x, replicas), *args).reshape(-1, *x.shape[1:])


def _refill(
    model, s: Slots, requests: Requests, *, replicas, chunk, heads, sampling, eos_id,
    page_tokens=0,
):  # fmt: skip
    """One refill round: each replica with an empty slot takes the next waiting request, in
    replica order, into its first empty slot; the requests' prompts are prefilled together (one
    row per replica, on that replica's devices) and their cache rows written into the slots.
    Their first tokens are sampled by the next decode iteration, from the prompts' last hidden
    states (`fresh`), in the same output-head call as every other slot's token: a refill pays
    the prompt's body, not an output head and a sampler of its own. A paged cache's round
    (`paged_slots.choose_refill`) re-prefills a parked slot first and waits for pages."""
    total = requests.caps.shape[0]
    prompt_len = requests.prompts.shape[1]
    if isinstance(s.cache, PagedCache):
        take, local, request_ids, new = paged_slots.choose_refill(
            s.cache, s.request, s.waiting, requests.prompt_lens, replicas=replicas,
            page_tokens=page_tokens,
        )  # fmt: skip
    else:
        empty = _by_replica(s.request == total, replicas)  # [r, W / r]
        has = empty.any(axis=1)
        rank = jnp.cumsum(has) - 1
        take = new = has & (s.waiting + rank < total)
        request_ids = jnp.where(take, s.waiting + rank, total)  # [r]
        local = jnp.where(take, jnp.argmax(empty, axis=1), empty.shape[1])  # out of range: kept
    taken = jnp.minimum(request_ids, total - 1)
    prompt_lens = requests.prompt_lens[taken]
    prefilled, last = _prefill_rows(
        model, requests.prompts[taken], prompt_lens, chunk=chunk, slots=prompt_len, heads=heads
    )

    def put(x, new, *within):  # each replica's `new` into its slot `local`, at [slot, *within]
        write = lambda rows, i, value: rows.at[(i, *within)].set(value, mode="drop")
        return _per_replica(write, x, local, new, replicas=replicas)

    if isinstance(s.cache, PagedCache):
        cache, _ = paged_slots.write_prompts(
            s.cache, prefilled, local[:, None], prompt_lens[:, None], replicas=replicas,
            page_tokens=page_tokens,
        )  # fmt: skip
        cache = paged_slots.refilled(cache, put(jnp.zeros_like(s.pending), take))
    else:
        prompt_slots = (slice(None), slice(None, prompt_len))  # [E, P] of a slot's [E, S, h]
        cache = jax.tree.map(lambda c, new: put(c, new, *prompt_slots), s.cache, prefilled)
    return s._replace(
        cache=cache,
        request=put(s.request, request_ids),
        length=put(s.length, jnp.zeros_like(request_ids)),
        prompt_len=put(s.prompt_len, prompt_lens),
        pending=put(s.pending, jnp.ones_like(take)),
        fresh=put(s.fresh, last),
        waiting=s.waiting + new.sum(dtype=jnp.int32),
        counts=s.counts.at[3].add(take.sum(dtype=jnp.int32)),
    )


def _decode_iteration(
    model, s: Slots, requests: Requests, *, sampling, eos_id, vocab_shards, replicas=1,
    page_tokens=0, paged_kernel: PagedKernel | None = None,
) -> Slots:  # fmt: skip
    """One token for every slot; empty slots are computed and their results dropped. A pending
    slot (refilled, `_refill`) takes its first token from its prompt's hidden state in place of
    the body's output; its body row is computed and dropped, its key/value written at slot P,
    which its first token's overwrites next iteration (the prompt's slots stay intact). A paged
    cache's slot decodes only once it has the page its token needs (`_paged_body`)."""
    width, total = s.request.shape[0], requests.caps.shape[0]
    live = s.request < total
    position = s.prompt_len + s.length - 1  # the last token's position in its sequence
    if isinstance(s.cache, PagedCache):
        s, hidden, go = _paged_body(
            model, s, live, position, replicas=replicas, page_tokens=page_tokens,
            kernel=paged_kernel,
        )  # fmt: skip
    else:
        slots, prompt_len = s.cache[0][0].shape[2], requests.prompts.shape[1]
        valid = jnp.arange(slots)[None, :] >= (prompt_len - s.prompt_len)[:, None]
        write_at = prompt_len + s.length - 1 + s.pending
        hidden, cache = model(s.last[:, None], position[:, None], valid, s.cache, write_at)
        s, hidden, go = s._replace(cache=cache), hidden[:, 0], None
    hidden = jnp.where(s.pending[:, None], s.fresh, hidden)
    token, logprob = _sample_rows(
        sampling,
        s.key,
        requests.first + jnp.minimum(s.request, total - 1),
        s.length,
        model.logits(hidden),
        vocab_shards,
    )
    decoded = live if go is None else go
    counts = s.counts + jnp.array([1, 0, width, 0], jnp.int32).at[1].set(decoded.sum())
    s = s._replace(counts=counts, pending=jnp.zeros_like(s.pending))
    slot_ids, request_ids = _going(go, s.request, total)
    s = _record(s, slot_ids, request_ids, token, logprob, requests, sampling, eos_id)
    return _release_ended(s, total, replicas)


def _paged_body(
    model: Transformer, s: Slots, live: Array, position: Array, *, replicas: int, page_tokens: int,
    kernel: PagedKernel | None,
) -> tuple[Slots, Array, Array]:  # fmt: skip
    """The model's body over a paged cache: every running slot takes the page its token needs
    (or waits, or is preempted: `paged_slots.make_room`), then the slots that go write their
    token and attend over their pages. A pending slot writes nothing (its first token is
    written next iteration at position P). Returns the slots (a preempted one parked, its
    request starting over), the hidden states [W, D] and the slots that decoded [W]."""
    assert isinstance(s.cache, PagedCache)
    cache, go, victim = paged_slots.make_room(
        s.cache, running=live & ~s.cache.parked, tokens=position + 1, replicas=replicas,
        page_tokens=page_tokens,
    )  # fmt: skip
    views = paged_slots.layers(
        cache, position=position, write=go & ~s.pending, replicas=replicas,
        page_tokens=page_tokens, kernel=kernel,
    )  # fmt: skip
    hidden, written = model(s.last[:, None], position[:, None], None, views, None)
    cache = cache._replace(pools=tuple(view.pool for view in cast(tuple[PagedLayer, ...], written)))
    s = s._replace(cache=cache, length=jnp.where(victim, 0, s.length))
    return s, hidden[:, 0], go


def run(
    graphdef,
    params,
    slots: Slots,
    requests: Requests,
    *,
    floor,
    refill,
    replicas,
    chunk,
    cache_heads,
    sampling,
    eos_id,
    vocab_shards=1,
    page_tokens=0,
    paged_kernel: PagedKernel | None = None,
) -> Slots:
    """Decode (and refill, with `refill`) until no slot is live, or nothing waits and at most
    `floor` / `replicas` slots are live in every replica (`compact` narrows each replica's
    slots on its own devices). The final state is returned whole so that a donated input
    updates its cache in place. A paged cache (`page_tokens` per page) re-prefills its parked
    slots by refill rounds with or without `refill` (which then takes no waiting request), and
    attends with the TPU kernel on `paged_kernel`'s mesh where given (locoexp/model/
    paged_kernel.py), else with the XLA path."""
    model = nnx.merge(graphdef, params)
    total = requests.caps.shape[0]
    paged = isinstance(slots.cache, PagedCache)

    def fill(s: Slots) -> Slots:
        def more(s):
            if paged:
                return paged_slots.choose_refill(
                    s.cache, s.request, s.waiting, requests.prompt_lens, replicas=replicas,
                    page_tokens=page_tokens,
                )[0].any()  # fmt: skip
            return (s.request == total).any() & (s.waiting < total)

        step = functools.partial(
            _refill, model, requests=requests, replicas=replicas, chunk=chunk,
            heads=cache_heads, sampling=sampling, eos_id=eos_id, page_tokens=page_tokens,
        )  # fmt: skip
        return jax.lax.while_loop(more, step, s)

    def cond(s: Slots):
        live = _by_replica(s.request < total, replicas).sum(axis=1)  # [r]
        return (live.sum() > 0) & ((s.waiting < total) | (live.max() > floor // replicas))

    def body(s: Slots) -> Slots:
        s = _decode_iteration(
            model, s, requests, sampling=sampling, eos_id=eos_id, vocab_shards=vocab_shards,
            replicas=replicas, page_tokens=page_tokens, paged_kernel=paged_kernel,
        )  # fmt: skip
        return fill(s) if refill or paged else s

    return jax.lax.while_loop(cond, body, fill(slots) if refill or paged else slots)


def iteration(
    graphdef, params, slots: Slots, requests: Requests, *, sampling, eos_id, vocab_shards=1,
    replicas=1, page_tokens=0, paged_kernel: PagedKernel | None = None,
) -> Slots:  # fmt: skip
    """One decode iteration, `run`'s loop body without its refill rounds, as a program of its
    own: XLA's cost analysis counts a while loop's body once whatever its trip count, so one
    iteration's figures are read from this program (tools/bench_paged_tpu_bytes.py)."""
    return _decode_iteration(
        nnx.merge(graphdef, params), slots, requests, sampling=sampling, eos_id=eos_id,
        vocab_shards=vocab_shards, replicas=replicas, page_tokens=page_tokens,
        paged_kernel=paged_kernel,
    )  # fmt: skip


def compact(slots: Slots, *, width, replicas) -> Slots:
    """Each replica's live slots first, the first `width` / `replicas` of them kept (every live
    one: the engine asks for a width whose share per replica is at least the busiest replica's
    live count). Rows never leave their replica's devices."""
    total = slots.lengths.shape[0]
    empty = _by_replica(slots.request >= total, replicas)
    keep = jnp.argsort(empty, axis=1, stable=True)[:, : width // replicas]  # [r, width / r]
    take = lambda x: _per_replica(lambda own, kept: own[kept], x, keep, replicas=replicas)
    if isinstance(slots.cache, PagedCache):
        cache = paged_slots.compact(slots.cache, take)
    else:
        cache = jax.tree.map(take, slots.cache)
    return slots._replace(
        cache=cache,
        request=take(slots.request),
        length=take(slots.length),
        prompt_len=take(slots.prompt_len),
        last=take(slots.last),
        pending=take(slots.pending),
        fresh=take(slots.fresh),
    )
