"""A tiny random policy and full-forward references for the engine, packing and trainer tests.

`init_std=0.3` makes the random logits peaked (greedy paths differ between prompts, EOS is hit
by some rows and not others), while fp32 keeps full-forward and KV-cache numerics within 1e-5.
The reference here is the plainest use of the model: one unpadded sequence per row, positions
0..T-1, a causal mask, no cache.
"""

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from locoexp.model.config import ModelConfig
from locoexp.model.transformer import Transformer, build_model, causal_segment_mask

TINY = ModelConfig(
    vocab_size=32,
    num_layers=2,
    hidden_dim=32,
    mlp_dim=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    init_std=0.3,
)
PAD = 0  # prompts below never use token 0, so a pad in a completion can only come from padding


@functools.cache
def _initial_model(seed: int) -> Transformer:
    return build_model(TINY, seed=seed)


def tiny_model(seed: int = 0) -> Transformer:
    """A fresh model with its own buffers (a trainer step may donate them), initialised once."""
    graphdef, state = nnx.split(_initial_model(seed))
    return nnx.merge(graphdef, jax.tree.map(jnp.copy, state))


def random_prompts(
    lengths: Sequence[int], *, seed: int, vocab: int = TINY.vocab_size
) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, size=n).astype(np.int32) for n in lengths]


@jax.jit
def _logits(graphdef, params, tokens, segment_ids):
    model = nnx.merge(graphdef, params)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    hidden, _ = model(tokens, positions, causal_segment_mask(segment_ids))
    return model.logits(hidden)


def full_forward_logits(
    model: Transformer, sequences: Sequence[np.ndarray], length: int = 64
) -> list[np.ndarray]:
    """Logits [T_n, V] of each sequence, each alone in its row (right padding is never attended)."""
    tokens = np.zeros((len(sequences), length), np.int32)
    segments = np.zeros((len(sequences), length), np.int32)
    for n, s in enumerate(sequences):
        tokens[n, : len(s)] = s
        segments[n, : len(s)] = 1
    graphdef, params = nnx.split(model, nnx.Param)
    logits = np.asarray(_logits(graphdef, params, tokens, segments))
    return [logits[n, : len(s)] for n, s in enumerate(sequences)]


def log_softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    scaled = logits.astype(np.float64) / (temperature if temperature > 0 else 1.0)
    scaled -= scaled.max(axis=-1, keepdims=True)
    return scaled - np.log(np.exp(scaled).sum(axis=-1, keepdims=True))


def reference_logprobs(
    model: Transformer,
    prompts: Sequence[np.ndarray],
    completions: Sequence[np.ndarray],
    *,
    temperature: float,
) -> list[np.ndarray]:
    """Log-prob of each completion token under softmax(logits / T) of a full forward pass."""
    sequences = [np.concatenate([p, c]) for p, c in zip(prompts, completions, strict=True)]
    out = []
    for p, c, logits in zip(
        prompts, completions, full_forward_logits(model, sequences), strict=True
    ):
        predicting = log_softmax(logits[len(p) - 1 : len(p) - 1 + len(c)], temperature)
        out.append(predicting[np.arange(len(c)), c].astype(np.float32))
    return out
