"""Token sampling from final logits, with the log-prob of the sampled token.

The default path (no top-k, no top-p: the paper's sampler "does not compute the top-k and top-p
masks") samples exactly by a two-level inverse CDF: block sums of exp(logits) pick a block of the
vocabulary, a cumulative sum inside the block picks the token. It reads the [N, V] logits twice
(max, then a fused exp-and-sum) and draws one uniform per row, where `jax.random.categorical`
draws V Gumbel variates per row: at V = 151,936 that is 10 ms against 256 ms per decode
iteration on a 2-core CPU (tools/bench_w1.py).

Returned log-probs are those of softmax(logits / T) before any top-k/top-p truncation, which is
what the trainer recomputes (`locoexp.trainer.logprobs`). Temperature 0 is greedy with T = 1
log-probs.

`vocab_shards` > 1: the logits arrive split by vocabulary over that many devices (a
tensor-parallel engine's vocabulary-parallel head, locoexp/rollout/sharding.py). Every step then
keeps to shard boundaries so that XLA never gathers the [N, V] logits: the blocks tile each
shard (their count is a multiple of the shards), so only the [N, V / block] block masses cross
devices, for their cumulative sum; greedy and top-p alone reduce over V. With top-k, XLA's
partitioner gathers the [N, V] logits within the TP group before `lax.top_k` (it does not split
a top-k along a batch axis either: measured on CPU), so a top-k sampler pays that gather. The
paper's authors added vocabulary-sharded sampling to tpu-inference ("Opt-in vocab-sharded
sampling", Table D2).
"""

import jax
import jax.numpy as jnp

Array = jax.Array


def _block_size(vocab: int, shards: int = 1) -> int:
    """The largest block (<= 128) that divides the vocabulary into at least two blocks, a
    whole number of them per shard."""
    for block in (128, 64, 32, 16, 8, 4, 2):
        blocks = vocab // block
        if vocab % block == 0 and blocks >= 2 and blocks % shards == 0:
            return block
    return 1


def _sample_full(key: Array, logits: Array, shards: int = 1) -> tuple[Array, Array]:
    """Exact sample from softmax(logits) [N, V] -> (token [N], log-prob [N])."""
    n, vocab = logits.shape
    block = _block_size(vocab, shards)
    top = jnp.max(logits, axis=-1)
    blocks = logits.reshape(n, vocab // block, block)
    block_mass = jnp.exp(blocks - top[:, None, None]).sum(-1)  # [N, V/block]
    cdf = jnp.cumsum(block_mass, axis=-1)
    total = cdf[:, -1]
    u = jax.random.uniform(key, (n,)) * total
    b = jnp.minimum(jnp.sum(cdf < u[:, None], axis=-1), vocab // block - 1)
    below = jnp.take_along_axis(cdf - block_mass, b[:, None], axis=-1)[:, 0]
    inner = jnp.exp(jnp.take_along_axis(blocks, b[:, None, None], axis=1)[:, 0] - top[:, None])
    j = jnp.minimum(
        jnp.sum(jnp.cumsum(inner, axis=-1) + below[:, None] < u[:, None], axis=-1), block - 1
    )
    token = b * block + j
    logprob = jnp.take_along_axis(logits, token[:, None], axis=-1)[:, 0] - top - jnp.log(total)
    return token, logprob


def _top_p_mask(logits: Array, top_p: float) -> Array:
    """[N, V] bool: the smallest set of the most probable tokens holding `top_p` of the mass,
    found without sorting V. Token i belongs to it iff the tokens more probable than i hold less
    than `top_p`, i.e. iff p_i >= v*, the smallest v with mass(p > v) < top_p. Non-negative
    float32 values order as their int32 bits, so v* is bisected over the bits: 31 masked sums
    over V (each local to a vocabulary shard, then one [N] all-reduce), where `lax.top_k` of
    all V sorted it (26.9 s for 27 decode iterations of 16 rows at V 151,936 on CPU, a sort XLA
    then distributes over the shards of a vocabulary-parallel head: 170 s; experiments/LOG.md,
    session 19). Equal to the sorted cumulative sum's set except where probabilities tie at
    the boundary (all tied tokens are kept)."""
    probs = jax.nn.softmax(logits, axis=-1)
    bits = jax.lax.bitcast_convert_type(probs, jnp.int32)  # >= 0, ordered as the floats

    def halve(_, bounds):  # mass(p > lo) >= top_p > mass(p > hi)
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        below = jnp.where(bits > mid[:, None], probs, 0.0).sum(axis=-1) < top_p
        return jnp.where(below, lo, mid), jnp.where(below, mid, hi)

    # lo = -1 counts every token (mass 1 >= top_p); hi, the top token's bits, counts none;
    # bits of a probability are < 2**30, so 31 halvings leave hi = v*
    lo = jnp.full(logits.shape[:1], -1, jnp.int32)
    _, hi = jax.lax.fori_loop(0, 31, halve, (lo, bits.max(axis=-1)))
    return bits >= hi[:, None]


def _sample_truncated(key: Array, logits: Array, top_k: int, top_p: float) -> Array:
    """Sample among the top-k tokens, then within the smallest set holding top_p of the mass."""
    values, indices = jax.lax.top_k(logits, top_k)  # sorted, descending
    if top_p < 1.0:
        probs = jax.nn.softmax(values, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        values = jnp.where(mass_before < top_p, values, -jnp.inf)  # always keeps the top token
    choice = jax.random.categorical(key, values, axis=-1)
    return jnp.take_along_axis(indices, choice[:, None], axis=-1)[:, 0]


def sample_tokens(
    key: Array,
    logits: Array,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    vocab_shards: int = 1,
) -> tuple[Array, Array]:
    """logits [N, V] float32 -> (tokens [N] int32, log-probs [N] float32). Arguments are static;
    `vocab_shards`: see the module note."""
    if temperature == 0.0:
        token = jnp.argmax(logits, axis=-1)
        logprob = jnp.take_along_axis(jax.nn.log_softmax(logits), token[:, None], axis=-1)[:, 0]
        return token.astype(jnp.int32), logprob
    scaled = logits / temperature
    if top_k == 0 and top_p >= 1.0:
        token, logprob = _sample_full(key, scaled, vocab_shards)
        return token.astype(jnp.int32), logprob
    if top_k == 0:  # top-p alone: the exact sampler over the nucleus, no sort of V
        nucleus = jnp.where(_top_p_mask(scaled, top_p), scaled, -jnp.inf)
        token, _ = _sample_full(key, nucleus, vocab_shards)
    else:
        token = _sample_truncated(key, scaled, top_k, top_p)
    logprob = jnp.take_along_axis(jax.nn.log_softmax(scaled), token[:, None], axis=-1)[:, 0]
    return token.astype(jnp.int32), logprob
