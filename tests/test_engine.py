"""The JAX rollout engine against full forward passes of the same model (fp32, 1e-5).

Every expectation comes from the plainest computation: each sequence alone, no cache, no padding
(`tiny_policy.full_forward_logits`). EOS behaviour is checked by running the same seeded sampler
twice, once with an EOS id no token can take, once with a real one: the draws are identical up to
each row's first EOS, so the expected padding, lengths and flags follow exactly.
"""

import dataclasses
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_policy import (
    PAD,
    TINY,
    full_forward_logits,
    random_prompts,
    reference_logprobs,
    tiny_model,
)

from locoexp.errors import ConfigError
from locoexp.model.config import DType
from locoexp.model.transformer import Transformer, causal_segment_mask, init_cache
from locoexp.placement import phases
from locoexp.rollout.config import RolloutConfig, SamplingParams, Scheduler
from locoexp.rollout.engine import JaxEngine, padded_prompt_tokens
from locoexp.rollout.protocol import Engine
from locoexp.rollout.sampling import sample_tokens

NO_EOS = -1  # no token id equals it: generation runs to the cap
MAX_NEW = 12
LENGTHS = (3, 5, 9, 4, 7, 2, 6, 8)  # left padding differs per row
SAMPLE = SamplingParams(temperature=1.0)
GREEDY = SamplingParams(temperature=0.0)


def make_engine(model, *, eos_id=NO_EOS, **rollout) -> JaxEngine:
    config = RolloutConfig(**{"prompt_bucket_tokens": 1, **rollout})
    return JaxEngine(model, config, eos_id=eos_id, pad_id=PAD, devices=jax.local_devices())


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def engine(model):
    """Shared, so tests with the same shapes and sampling reuse one compiled program."""
    return make_engine(model)


@pytest.fixture(scope="module")
def eos_engine(model, eos_id):
    return make_engine(model, eos_id=eos_id)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(LENGTHS, seed=1)


@pytest.fixture(scope="module")
def free_run(engine, prompts):
    """Seeded temperature-1 samples that never stop early."""
    return engine.generate(prompts, key=jax.random.key(7), max_new_tokens=MAX_NEW, sampling=SAMPLE)


@pytest.fixture(scope="module")
def eos_id(free_run):
    """A token that the free run samples first at step 0 in some row, mid-completion in another,
    at the last allowed step in a third, and never in a fourth: every EOS case in one run."""
    tokens = free_run.tokens
    for token in range(1, TINY.vocab_size):
        hit = (tokens == token).any(axis=1)
        first = set(np.argmax(tokens == token, axis=1)[hit].tolist())
        if not hit.all() and {0, MAX_NEW - 1} <= first and first - {0, MAX_NEW - 1}:
            return token
    pytest.fail("no token of the free run covers every EOS case; change the seeds")


def greedy_reference(model, prompts, steps: int) -> np.ndarray:
    """Greedy completions by repeated full forward passes (no cache, no padding)."""
    sequences = [p.copy() for p in prompts]
    for _ in range(steps):
        logits = full_forward_logits(model, sequences)
        sequences = [
            np.append(s, np.int32(np.argmax(lg[-1])))
            for s, lg in zip(sequences, logits, strict=True)
        ]
    return np.stack([s[len(p) :] for s, p in zip(sequences, prompts, strict=True)])


@jax.jit
def _cached_forward(graphdef, params, tokens, positions, mask, cache, index):
    model = nnx.merge(graphdef, params)
    hidden, cache = model(tokens, positions, mask, cache, index)
    return model.logits(hidden), cache


def test_model_kv_cache_decode_logits_equal_full_forward(model):
    prompt_len, steps = 5, 7
    sequences = np.stack(random_prompts([prompt_len + steps] * 3, seed=2))
    rows, slots = sequences.shape
    expected = np.stack(full_forward_logits(model, list(sequences)))

    graphdef, params = nnx.split(model, nnx.Param)
    valid = np.ones((rows, slots), bool)  # no padding: causality comes from slot order
    positions = np.broadcast_to(np.arange(prompt_len), (rows, prompt_len))
    logits, cache = _cached_forward(
        graphdef,
        params,
        sequences[:, :prompt_len],
        positions,
        valid,
        init_cache(model.config, rows, slots),
        0,
    )
    got = [logits]
    for t in range(prompt_len, slots):  # one token per call, attending to the cache only
        logits, cache = _cached_forward(
            graphdef, params, sequences[:, t : t + 1], np.full((rows, 1), t), valid, cache, t
        )
        got.append(logits)
    np.testing.assert_allclose(np.concatenate(got, axis=1), expected, atol=1e-5, rtol=0)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="what XLA's CPU backend emits")
def test_cached_attention_compiles_without_a_plain_dot_over_the_cache():
    """Decode attention at Table 1's 2,304 slots lowers to XLA-CPU's YNNPACK fusions only: the
    values product written as [B,T,E,R,h] became a plain dot with the cache as its transposed
    operand, 20x slower, the generation regression of issue 42 (experiments/LOG.md)."""
    from locoexp.model.layers import attend_cached

    rows, heads, kv_heads, slots, h = 8, 4, 2, 2304, 64
    q = jnp.zeros((rows, 1, heads, h))
    k = v = jnp.zeros((rows, 1, kv_heads, h))
    cache = (jnp.zeros((rows, kv_heads, slots, h)),) * 2
    valid = jnp.ones((rows, slots), bool)
    index = jnp.zeros((rows,), jnp.int32)
    hlo = jax.jit(attend_cached).lower(q, k, v, valid, cache, index).compile().as_text()
    assert _unfused_dots(hlo) == []
    assert " dot(" in hlo  # the products are there, inside fusions


def _unfused_dots(hlo: str) -> list[str]:
    """The dots of optimised HLO text that no fusion computes (each computation's dots, less
    those of computations a fusion calls)."""
    fused = set(re.findall(r"kind=\w+, calls=(%[\w.-]+)", hlo))
    dots, computation = [], None
    for line in hlo.splitlines():
        if line and not line.startswith(" ") and "{" in line:
            computation = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
        elif " dot(" in line and computation not in fused:
            dots.append(f"{computation}: {line.strip()[:120]}")
    return dots


def test_causal_segment_mask_blocks_other_segments_future_and_padding():
    mask = np.asarray(causal_segment_mask(jnp.array([[1, 1, 2, 2, 0]])))[0]
    expected = np.array(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 0, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 0, 0, 0],
        ],
        bool,
    )
    np.testing.assert_array_equal(mask, expected)


def test_engine_logprobs_equal_full_forward_recomputation(model, engine, prompts):
    rollout = engine.generate(
        prompts, key=jax.random.key(3), max_new_tokens=MAX_NEW, sampling=SAMPLE
    )
    completions = [rollout.completion(n) for n in range(len(prompts))]
    expected = reference_logprobs(model, prompts, completions, temperature=1.0)
    np.testing.assert_allclose(rollout.logprobs, np.stack(expected), atol=1e-5, rtol=0)


def test_temperature_zero_and_top_k_one_equal_full_forward_argmax(model, engine, prompts):
    greedy = engine.generate(
        prompts, key=jax.random.key(0), max_new_tokens=MAX_NEW, sampling=GREEDY
    )
    top1 = engine.generate(
        prompts,
        key=jax.random.key(5),
        max_new_tokens=MAX_NEW,
        sampling=SamplingParams(temperature=1.0, top_k=1),
    )
    expected = greedy_reference(model, prompts, MAX_NEW)
    np.testing.assert_array_equal(greedy.tokens, expected)
    np.testing.assert_array_equal(top1.tokens, expected)
    # temperature 0 reports log-probs at T = 1, as the trainer recomputes them
    reference = reference_logprobs(model, prompts, list(expected), temperature=1.0)
    np.testing.assert_allclose(greedy.logprobs, np.stack(reference), atol=1e-5, rtol=0)


def test_rows_stop_at_eos_then_pad_with_zero_logprobs(eos_engine, prompts, free_run, eos_id):
    rollout = eos_engine.generate(
        prompts, key=jax.random.key(7), max_new_tokens=MAX_NEW, sampling=SAMPLE
    )
    hit = (free_run.tokens == eos_id).any(axis=1)
    first = np.argmax(free_run.tokens == eos_id, axis=1)
    expected_lengths = np.where(hit, first + 1, MAX_NEW)  # EOS counts; EOS on the last step too
    np.testing.assert_array_equal(rollout.lengths, expected_lengths)
    np.testing.assert_array_equal(rollout.truncated, ~hit)
    for n, length in enumerate(expected_lengths):
        np.testing.assert_array_equal(rollout.tokens[n, :length], free_run.tokens[n, :length])
        np.testing.assert_array_equal(rollout.tokens[n, length:], PAD)
        np.testing.assert_allclose(
            rollout.logprobs[n, :length], free_run.logprobs[n, :length], atol=1e-6
        )
        np.testing.assert_array_equal(rollout.logprobs[n, length:], 0.0)
        assert (rollout.logprobs[n, :length] < 0).all()
    assert rollout.decode_iterations == expected_lengths.max() - 1


def test_ignore_eos_forces_every_row_to_the_cap(eos_engine, prompts, free_run, eos_id):
    rollout = eos_engine.generate(
        prompts,
        key=jax.random.key(7),
        max_new_tokens=MAX_NEW,
        sampling=SamplingParams(temperature=1.0, ignore_eos=True),
    )
    assert (rollout.tokens == eos_id).any(), (
        "EOS must be sampled somewhere for this test to mean anything"
    )
    np.testing.assert_array_equal(rollout.lengths, MAX_NEW)
    np.testing.assert_array_equal(rollout.truncated, True)
    np.testing.assert_array_equal(rollout.tokens, free_run.tokens)
    np.testing.assert_allclose(rollout.logprobs, free_run.logprobs, atol=1e-6)
    assert (rollout.logprobs < 0).all()
    assert rollout.decode_iterations == MAX_NEW - 1


def test_left_padded_prompts_complete_as_each_prompt_alone(engine, prompts):
    batch = engine.generate(prompts, key=jax.random.key(0), max_new_tokens=MAX_NEW, sampling=GREEDY)
    n = int(np.argmin(LENGTHS))  # the most left padding in the batch, none alone
    alone = engine.generate(
        [prompts[n]], key=jax.random.key(0), max_new_tokens=MAX_NEW, sampling=GREEDY
    )
    np.testing.assert_array_equal(batch.tokens[n], alone.tokens[0])
    np.testing.assert_allclose(batch.logprobs[n], alone.logprobs[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("scheduler", list(Scheduler))
def test_capacity_below_requests_generates_the_one_wave_results(model, scheduler):
    prompts = random_prompts((3, 5, 9, 4, 7, 2, 6, 8, 5, 3), seed=4)
    greedy = greedy_reference(model, prompts, MAX_NEW)
    # an EOS that greedy decoding reaches in some rows only, so rows end at different steps
    eos = next(t for t in range(1, TINY.vocab_size) if 0 < (greedy == t).any(axis=1).sum() < 10)
    one_wave = make_engine(model, eos_id=eos).generate(
        prompts, key=jax.random.key(0), max_new_tokens=MAX_NEW, sampling=GREEDY
    )
    assert one_wave.waves == 1
    assert one_wave.truncated.any() and not one_wave.truncated.all()
    # capacity 4: waves of 4, 4 and 2 requests (the last wave padded with a repeated prompt),
    # or 4 slots refilled 6 times
    waved = make_engine(model, eos_id=eos, capacity=4, scheduler=scheduler).generate(
        prompts, key=jax.random.key(0), max_new_tokens=MAX_NEW, sampling=GREEDY
    )
    assert (waved.waves, waved.refills) == ((3, 0) if scheduler is Scheduler.waves else (1, 6))
    np.testing.assert_array_equal(waved.tokens, one_wave.tokens)
    np.testing.assert_array_equal(waved.lengths, one_wave.lengths)
    np.testing.assert_array_equal(waved.truncated, one_wave.truncated)
    np.testing.assert_allclose(waved.logprobs, one_wave.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["load_weights", "load_weights_per_layer"])
def test_published_weights_are_the_ones_sampled(model, engine, prompts, method):
    other = tiny_model(seed=1)
    expected = greedy_reference(other, prompts, MAX_NEW)
    before = engine.generate(
        prompts, key=jax.random.key(0), max_new_tokens=MAX_NEW, sampling=GREEDY
    )
    assert (before.tokens != expected).any()
    try:
        getattr(engine, method)(nnx.state(other, nnx.Param))
        after = engine.generate(
            prompts, key=jax.random.key(0), max_new_tokens=MAX_NEW, sampling=GREEDY
        )
    finally:
        engine.load_weights(nnx.state(model, nnx.Param))  # the engine is shared with other tests
    np.testing.assert_array_equal(after.tokens, expected)
    reference = reference_logprobs(other, prompts, list(expected), temperature=1.0)
    np.testing.assert_allclose(after.logprobs, np.stack(reference), atol=1e-5, rtol=0)


def test_engine_samples_only_inside_top_k_and_nucleus(model, engine, prompts):
    top_k, top_p, temperature = 5, 0.6, 0.8
    requests = prompts * 4
    rollout = engine.generate(
        requests,
        key=jax.random.key(11),
        max_new_tokens=MAX_NEW,
        sampling=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p),
    )
    sequences = [np.concatenate([p, rollout.completion(n)]) for n, p in enumerate(requests)]
    for n, (p, logits) in enumerate(
        zip(requests, full_forward_logits(model, sequences), strict=True)
    ):
        for j in range(MAX_NEW):
            allowed = allowed_tokens(logits[len(p) - 1 + j] / temperature, top_k, top_p)
            assert rollout.tokens[n, j] in allowed, (n, j)
    # log-probs are those of the untruncated softmax(logits / T), what the trainer recomputes
    completions = [rollout.completion(n) for n in range(len(requests))]
    expected = reference_logprobs(model, requests, completions, temperature=temperature)
    np.testing.assert_allclose(rollout.logprobs, np.stack(expected), atol=1e-5, rtol=0)


def allowed_tokens(logits: np.ndarray, top_k: int, top_p: float) -> set[int]:
    """The top-k set, then the smallest prefix (by probability) holding top_p of its mass."""
    order = np.argsort(-logits, kind="stable")[: top_k or len(logits)]
    probs = np.exp(logits[order] - logits[order].max())
    probs /= probs.sum()
    mass_before = np.cumsum(probs) - probs
    # 1e-6 of slack: a token exactly on the boundary may go either way in float32
    return {int(t) for t, m in zip(order, mass_before, strict=True) if m < top_p + 1e-6}


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (0, 0.6), (8, 0.5)])
def test_sampler_draws_only_inside_top_k_and_nucleus(top_k, top_p):
    logits = jax.random.normal(jax.random.key(0), (4096, 32)) * 2.0
    tokens, logprobs = sample_tokens(
        jax.random.key(1), logits, temperature=1.0, top_k=top_k, top_p=top_p
    )
    logits = np.asarray(logits)
    for row, token in zip(logits, np.asarray(tokens), strict=True):
        assert int(token) in allowed_tokens(row, top_k, top_p)
    # the log-probs are those of the untruncated softmax (what the trainer recomputes)
    expected = log_softmax_np(logits)[np.arange(len(logits)), np.asarray(tokens)]
    np.testing.assert_allclose(np.asarray(logprobs), expected, atol=1e-5)


def log_softmax_np(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def empirical_frequencies(
    logits: np.ndarray, *, temperature: float, draws: int, **truncation
) -> np.ndarray:
    """Frequencies of `draws` tokens sampled from one row of logits, in batches of rows."""
    counts = np.zeros(logits.shape[-1])
    batch = 20_000
    sample = jax.jit(lambda key, x: sample_tokens(key, x, temperature=temperature, **truncation)[0])
    rows = jnp.broadcast_to(jnp.asarray(logits), (batch, logits.shape[-1]))
    for i in range(draws // batch):
        counts += np.bincount(
            np.asarray(sample(jax.random.key(100 + i), rows)), minlength=logits.shape[-1]
        )
    return counts / counts.sum()


def assert_matches(freq: np.ndarray, probs: np.ndarray, draws: int) -> None:
    """Pearson chi-square over tokens expected >= 5 times (the rarer ones pooled into one bin),
    below its 1 - 1e-4 quantile (Wilson-Hilferty); the draws are seeded, so it is deterministic."""
    expected, observed = probs * draws, freq * draws
    common = expected >= 5
    bins_expected = np.append(expected[common], expected[~common].sum())
    bins_observed = np.append(observed[common], observed[~common].sum())
    keep = bins_expected > 0
    chi2 = (((bins_observed - bins_expected) ** 2)[keep] / bins_expected[keep]).sum()
    dof = keep.sum() - 1
    critical = dof * (1 - 2 / (9 * dof) + 3.72 * np.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < critical, (
        f"chi-square {chi2:.1f} over {dof} degrees of freedom (critical {critical:.1f})"
    )
    # the truncated tail is never drawn
    assert observed[probs == 0].sum() == 0


@pytest.mark.parametrize("vocab, temperature", [(32, 1.0), (1024, 1.0), (1000, 0.5), (37, 1.0)])
def test_two_level_sampler_matches_softmax(vocab, temperature):
    """Blocks of 16, 128 and 8 tokens, and a prime vocabulary (block 1)."""
    logits = np.asarray(jax.random.normal(jax.random.key(vocab), (vocab,))) * 3.0
    draws = 100_000
    freq = empirical_frequencies(logits, temperature=temperature, draws=draws)
    probs = np.exp(log_softmax_np(logits / temperature))
    assert_matches(freq, probs, draws)


def test_top_k_sampler_matches_renormalised_softmax():
    logits = np.asarray(jax.random.normal(jax.random.key(3), (32,))) * 2.0
    draws = 100_000
    freq = empirical_frequencies(logits, temperature=1.0, draws=draws, top_k=4)
    top = np.argsort(-logits)[:4]
    probs = np.zeros_like(freq)
    probs[top] = np.exp(log_softmax_np(logits[top]))
    assert_matches(freq, probs, draws)


def test_top_p_sampler_alone_matches_the_renormalised_nucleus():
    """Top-p without top-k finds its nucleus by bisection over V (no sort): the sorted
    definition's set, and draws in proportion within it."""
    logits = np.asarray(jax.random.normal(jax.random.key(4), (64,))) * 2.0
    nucleus = sorted(allowed_tokens(logits, 0, 0.7))
    draws = 100_000
    freq = empirical_frequencies(logits, temperature=1.0, draws=draws, top_p=0.7)
    probs = np.zeros_like(freq)
    probs[nucleus] = np.exp(log_softmax_np(logits[nucleus]))
    assert_matches(freq, probs, draws)


def test_the_bisected_nucleus_is_the_sorted_cumulative_sums_set():
    from locoexp.rollout.sampling import _top_p_mask

    logits = jax.random.normal(jax.random.key(5), (512, 200)) * 3.0
    for top_p in (0.1, 0.5, 0.9, 0.99):
        mask = np.asarray(_top_p_mask(logits, top_p))
        for row, kept in zip(np.asarray(logits), mask, strict=True):
            assert set(np.flatnonzero(kept)) == allowed_tokens(row, 0, top_p), top_p


@pytest.mark.parametrize("vocab, shards", [(1024, 4), (96, 4), (384, 8)])
def test_two_level_sampler_on_vocabulary_shards_matches_softmax(vocab, shards):
    """Blocks that tile each shard (128, 8 and 16 tokens; unsharded: 128, 32 and 128): the
    same exact sampler."""
    logits = np.asarray(jax.random.normal(jax.random.key(vocab), (vocab,))) * 3.0
    draws = 100_000
    freq = empirical_frequencies(logits, temperature=1.0, draws=draws, vocab_shards=shards)
    assert_matches(freq, np.exp(log_softmax_np(logits)), draws)


def count_python_calls(fn) -> int:
    """Python-level function calls (and calls into C) made while `fn` runs."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_decode_loop_dispatches_do_not_grow_with_generated_tokens(engine, prompts):
    forced = SamplingParams(temperature=1.0, ignore_eos=True)

    def generate(max_new):
        return engine.generate(
            prompts, key=jax.random.key(0), max_new_tokens=max_new, sampling=forced
        )

    for max_new in (8, 64):  # compile both programs first
        generate(max_new)
    short, long = count_python_calls(lambda: generate(8)), count_python_calls(lambda: generate(64))
    assert generate(64).decode_iterations == 63
    assert long == short, f"{short} host calls for 8 tokens, {long} for 64"


def test_generate_program_does_not_grow_with_generated_tokens(engine, prompts):
    """The lowered program for 64 new tokens is the one for 8 with other constants: the decode
    loop is a device while loop, not unrolled per token or driven from the host."""
    wave = [np.zeros(16, np.int32)] * len(prompts)

    def lowered(max_new):
        start, run, requests = engine.wave_programs(wave, max_new_tokens=max_new, sampling=SAMPLE)
        args = (engine.params, requests, jax.random.key(0))
        slots = jax.eval_shape(start, *args)
        return start.lower(*args).as_text() + run.lower(engine.params, slots, requests).as_text()

    short, long = lowered(8), lowered(64)
    assert short.count("stablehlo.while") >= 1
    assert long.count("stablehlo.while") == short.count("stablehlo.while")
    assert len(long.splitlines()) == len(short.splitlines())


def prefill_state(engine: JaxEngine, prompts, max_new: int):
    """The slots the engine's first fill hands to decode, for `prompts` in one wave."""
    start, _, requests = engine.wave_programs(prompts, max_new_tokens=max_new, sampling=GREEDY)
    return jax.device_get(start(engine.params, requests, jax.random.key(0))), requests.prompt_lens


@pytest.mark.parametrize("chunk", [4, 5])
def test_chunked_prefill_equals_one_shot_prefill(model, chunk):
    """Prompts of 2-16 tokens: bucket 16, one chunk of 16 against chunks of 4 (whole) and of 5
    (the bucket rounded up to 20): the same cache on every real slot, the same completions."""
    prompts = random_prompts((3, 13, 9, 16, 7, 2, 11, 8), seed=6)
    one_shot, chunked = make_engine(model), make_engine(model, prefill_chunk_tokens=chunk)
    assert padded_prompt_tokens(16, chunked.config) == (16 if chunk == 4 else 20)
    whole, lens = prefill_state(one_shot, prompts, MAX_NEW)
    parts, _ = prefill_state(chunked, prompts, MAX_NEW)
    shift = parts.cache[0][0].shape[2] - whole.cache[0][0].shape[2]  # extra left padding
    for (wk, wv), (pk, pv) in zip(whole.cache, parts.cache, strict=True):
        for n, length in enumerate(lens):
            real = slice(16 - length, 16)  # the prompt's slots in the one-shot cache
            moved = slice(16 - length + shift, 16 + shift)
            np.testing.assert_allclose(pk[n, :, moved], wk[n, :, real], atol=1e-5, rtol=0)
            np.testing.assert_allclose(pv[n, :, moved], wv[n, :, real], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(parts.tokens[:, 0], whole.tokens[:, 0])
    np.testing.assert_allclose(parts.logprobs[:, 0], whole.logprobs[:, 0], atol=1e-5, rtol=0)
    greedy = chunked.generate(
        prompts, key=jax.random.key(0), max_new_tokens=MAX_NEW, sampling=GREEDY
    )
    np.testing.assert_array_equal(greedy.tokens, greedy_reference(model, prompts, MAX_NEW))
    a, b = (
        e.generate(prompts, key=jax.random.key(3), max_new_tokens=MAX_NEW, sampling=SAMPLE)
        for e in (one_shot, chunked)
    )
    np.testing.assert_array_equal(b.tokens, a.tokens)
    np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5, rtol=0)


def test_decode_time_per_iteration_excludes_prefill(model):
    """A long prompt and 3 decode iterations. The prefill and decode clocks are disjoint
    intervals of one `generate` call, so together they fit in its wall time: were prefill
    counted in the decode clock, the two would hold it twice and exceed the call (a long
    prefill). Whatever the machine's load does to each, this holds."""
    engine = make_engine(model, prefill_chunk_tokens=256)
    prompts = random_prompts((1024,) * 4, seed=8)
    forced = SamplingParams(temperature=1.0, ignore_eos=True)
    engine.generate(prompts, key=jax.random.key(0), max_new_tokens=4, sampling=forced)  # compiles
    start = time.perf_counter()
    rollout = engine.generate(prompts, key=jax.random.key(0), max_new_tokens=4, sampling=forced)
    wall_s = time.perf_counter() - start
    assert rollout.decode_iterations == 3 and rollout.prefill_s > 0 and rollout.decode_s > 0
    assert rollout.decode_s_per_iteration == rollout.decode_s / 3
    assert rollout.prefill_s + rollout.decode_s <= wall_s, (rollout, wall_s)


def bf16_copy(model: Transformer) -> Transformer:
    """The model as a bfloat16 model: its weights cast, computing in bfloat16."""
    config = dataclasses.replace(model.config, param_dtype=DType.bfloat16)
    copy = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    cast = jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(model, nnx.Param))
    nnx.update(copy, cast)
    return copy


def test_bf16_sampler_of_fp32_weights_equals_a_bf16_model(model, prompts):
    """Table I3's recipe: rollout.param_dtype=bfloat16 under an fp32 model samples exactly as
    the model cast to bfloat16, on start-up and after each publication path."""
    sampler = make_engine(model, param_dtype=DType.bfloat16)
    assert {x.dtype for x in jax.tree.leaves(sampler.params)} == {jnp.dtype(jnp.bfloat16)}
    run = lambda e: e.generate(
        prompts, key=jax.random.key(3), max_new_tokens=MAX_NEW, sampling=SAMPLE
    )
    expected, fp32 = run(make_engine(bf16_copy(model))), run(make_engine(model))
    got = run(sampler)
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    np.testing.assert_array_equal(got.logprobs, expected.logprobs)
    assert np.abs(got.logprobs - fp32.logprobs).max() > 1e-4  # bf16 numerics really ran
    other = tiny_model(seed=1)
    other_expected = run(make_engine(bf16_copy(other)))
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("fsdp",))
    for one_call in (True, False):
        sampler.load_weights(nnx.state(model, nnx.Param))
        phases.publish(nnx.state(other, nnx.Param), sampler, mesh=mesh, one_call=one_call)
        assert {x.dtype for x in jax.tree.leaves(sampler.params)} == {jnp.dtype(jnp.bfloat16)}
        np.testing.assert_array_equal(run(sampler).tokens, other_expected.tokens)


@pytest.mark.parametrize(
    "tensor_parallel, devices, heads, kv_heads",
    [(3, 3, 4, 2), (2, 1, 4, 2), (2, 2, 6, 3), (4, 4, 12, 3)],
    ids=["heads", "devices", "kv-heads-not-divided", "kv-heads-not-repeated-evenly"],
)
def test_a_tensor_parallel_degree_the_model_or_devices_cannot_take_is_refused(
    tensor_parallel, devices, heads, kv_heads
):
    config = dataclasses.replace(TINY, num_heads=heads, num_kv_heads=kv_heads)
    model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    with pytest.raises(ConfigError, match=f"rollout.tensor_parallel={tensor_parallel} ") as error:
        JaxEngine(
            model,
            RolloutConfig(tensor_parallel=tensor_parallel),
            eos_id=2,
            pad_id=PAD,
            devices=jax.local_devices()[:1] * devices,  # refused before any device is used
        )
    message = str(error.value)
    assert f"{devices} devices" in message and f"num_kv_heads={kv_heads}" in message
    assert message.count(".") == 1 + message.count("model.") + message.count("rollout.")


def test_jax_engine_satisfies_the_engine_protocol(engine):
    assert isinstance(engine, Engine)
