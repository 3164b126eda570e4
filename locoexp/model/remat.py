"""Rematerialisation of decoder blocks in the train step (`trainer.remat`).

Owns the mapping from `RematPolicy` to a `jax.checkpoint` policy and the wrapping of one block
call; it never decides which policy a run needs (the trainer config does) and never runs in
generation (there is no backward pass there).
"""

from collections.abc import Callable

import jax
from flax import nnx

from locoexp.model.config import RematPolicy


def checkpoint_policy(policy: RematPolicy) -> Callable | None:
    """The `jax.checkpoint` policy of `policy`; None for `none` (no checkpointing)."""
    match policy:
        case RematPolicy.none:
            return None
        case RematPolicy.block:
            return jax.checkpoint_policies.nothing_saveable
        case RematPolicy.save_matmuls:
            # weight matmuls have no batch dimension in dot_general's sense; attention's
            # [B, heads] einsums do, so attention is recomputed (blockwise: never stored anyway)
            return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
        case RematPolicy.offload:
            # Table H2: the 405B run offloaded saved activations to host memory
            return jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")


def call_block(block: nnx.Module, x: jax.Array, policy: RematPolicy, **kwargs) -> jax.Array:
    """block(x, **kwargs)[0], its activations kept or recomputed as `policy` says."""
    return call_block_outputs(block, x, policy, **kwargs)[0]


def call_block_outputs(block: nnx.Module, x: jax.Array, policy: RematPolicy, **kwargs) -> tuple:
    """Every output of block(x, **kwargs) (hidden states, cache and, for a mixture-of-experts
    block, its router statistics), its activations kept or recomputed as `policy` says."""
    if policy is RematPolicy.none:
        return block(x, **kwargs)
    graphdef, state = nnx.split(block)

    def run(state, x):
        return nnx.merge(graphdef, state)(x, **kwargs)

    return jax.checkpoint(run, policy=checkpoint_policy(policy))(state, x)
