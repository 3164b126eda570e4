"""The two compiled programs of one wave: chunked prefill, then the decode loop.

`prefill` writes the left-padded prompts into a fresh KV cache in chunks of `chunk` tokens per
sequence (one `fori_loop` iteration per chunk: attention scores are [C, H, chunk, S] per layer,
never [P, P]) and samples the first new token. `decode` runs a `lax.while_loop` that decodes
one token per row per iteration, attending over the cache slots only, until every row has hit
EOS or the cap; there is no host round trip per token (the paper's Eq. 2 per-iteration terms
are all device time). They are separate programs so that the engine times prefill and decode
iterations apart (`Rollout.prefill_s`, `Rollout.decode_s`; Figure 7b's per-iteration premium).

The programs are pure functions of (graphdef, params, arrays); they never know about devices,
meshes or waves (the engine compiles them with its shardings).

Shapes: C rows per wave, P padded prompt length (a whole number of chunks), M = max_new_tokens,
S = P + M slots, E cache heads.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from locoexp.model.transformer import KVCache, init_cache
from locoexp.rollout.sampling import sample_tokens

Array = jax.Array


class DecodeState(NamedTuple):
    """The decode loop's carry (also what prefill hands to decode)."""

    step: Array  # int32: column of `tokens` the next iteration writes (1 after prefill)
    cache: KVCache
    tokens: Array  # [C, M] int32, pad past each row's end
    logprobs: Array  # [C, M] float32, 0 past each row's end
    done: Array  # [C] bool: hit EOS (never with ignore_eos)
    lengths: Array  # [C] int32: generated tokens, EOS included
    key: Array


def _sampler(sampling):
    return functools.partial(
        sample_tokens, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p
    )


def _valid_slots(prompt_lens: Array, prompt_len: int, slots: int) -> Array:
    """[C, S]: False on each row's left padding (never attended)."""
    return jnp.arange(slots)[None, :] >= (prompt_len - prompt_lens)[:, None]


def prefill(
    graphdef,
    params,
    prompts,
    prompt_lens,
    key,
    *,
    chunk,
    max_new,
    cache_heads,
    sampling,
    eos_id,
    pad_id,
) -> DecodeState:
    """Left-padded prompts [C, P] -> the state after the first sampled token."""
    model = nnx.merge(graphdef, params)
    rows, prompt_len = prompts.shape
    valid = _valid_slots(prompt_lens, prompt_len, prompt_len + max_new)
    pad = prompt_len - prompt_lens

    def run_chunk(c, carry):
        cache, _ = carry
        start = c * chunk
        tokens = jax.lax.dynamic_slice_in_dim(prompts, start, chunk, axis=1)
        positions = jnp.maximum(start + jnp.arange(chunk)[None, :] - pad[:, None], 0)
        hidden, cache = model(tokens, positions, valid, cache, start)
        return cache, hidden[:, -1]

    cache = init_cache(model.config, rows, prompt_len + max_new, heads=cache_heads)
    last = jnp.zeros((rows, model.config.hidden_dim), jnp.dtype(model.config.param_dtype.value))
    cache, last = jax.lax.fori_loop(0, prompt_len // chunk, run_chunk, (cache, last))
    key, step_key = jax.random.split(key)
    token, logprob = _sampler(sampling)(step_key, model.logits(last))
    return DecodeState(
        step=jnp.int32(1),
        cache=cache,
        tokens=jnp.full((rows, max_new), pad_id, jnp.int32).at[:, 0].set(token),
        logprobs=jnp.zeros((rows, max_new), jnp.float32).at[:, 0].set(logprob),
        done=(token == eos_id) & (not sampling.ignore_eos),
        lengths=jnp.ones((rows,), jnp.int32),
        key=key,
    )


def decode(
    graphdef, params, state: DecodeState, prompt_lens, *, sampling, eos_id, pad_id
) -> DecodeState:
    """Decode until every row is done -> the final state (`step - 1` decode iterations). The
    final state is returned whole so that a donated input state updates in place (no copy of
    the KV cache)."""
    model = nnx.merge(graphdef, params)
    max_new = state.tokens.shape[1]
    slots = state.cache[0][0].shape[1]
    prompt_len = slots - max_new
    valid = _valid_slots(prompt_lens, prompt_len, slots)
    sample = _sampler(sampling)

    def cond(s: DecodeState):
        return (s.step < max_new) & ~jnp.all(s.done)

    def body(s: DecodeState) -> DecodeState:
        previous = s.tokens[:, s.step - 1]
        position = (prompt_lens + s.step - 1)[:, None]
        hidden, cache = model(previous[:, None], position, valid, s.cache, prompt_len + s.step - 1)
        key, step_key = jax.random.split(s.key)
        token, logprob = sample(step_key, model.logits(hidden[:, 0]))
        token = jnp.where(s.done, pad_id, token)
        done = s.done if sampling.ignore_eos else s.done | (token == eos_id)
        return DecodeState(
            step=s.step + 1,
            cache=cache,
            tokens=s.tokens.at[:, s.step].set(token),
            logprobs=s.logprobs.at[:, s.step].set(jnp.where(s.done, 0.0, logprob)),
            done=done,
            lengths=s.lengths + (~s.done).astype(jnp.int32),
            key=key,
        )

    return jax.lax.while_loop(cond, body, state)
