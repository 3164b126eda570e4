"""Random init (`build_model`): part by part, with the weights of the whole model initialised in
one program, and without that program's temporaries (experiments/LOG.md, session 10)."""

import dataclasses
import functools

import jax
import numpy as np
import pytest
from flax import nnx

from locoexp.model.config import DType, ModelConfig
from locoexp.model.transformer import Block, Transformer, _init_part, build_model

TINY = ModelConfig()


def one_program(config: ModelConfig, seed: int) -> Transformer:
    return nnx.jit(lambda: Transformer(config, rngs=nnx.Rngs(params=seed)))()


@pytest.mark.parametrize(
    "config",
    [
        TINY,
        dataclasses.replace(TINY, tie_embeddings=False),
        dataclasses.replace(TINY, param_dtype=DType.bfloat16, num_layers=3, qk_norm=False),
    ],
    ids=["tied", "untied", "bf16-3-layers-llama"],
)
@pytest.mark.parametrize("seed", [0, 7])
def test_part_by_part_init_equals_the_one_program_init_bit_for_bit(config, seed):
    whole = nnx.to_pure_dict(nnx.state(one_program(config, seed), nnx.Param))
    parts = nnx.to_pure_dict(nnx.state(build_model(config, seed=seed), nnx.Param))
    assert jax.tree.structure(parts) == jax.tree.structure(whole)
    for got, want in zip(jax.tree.leaves(parts), jax.tree.leaves(whole), strict=True):
        assert got.dtype == want.dtype and np.array_equal(np.asarray(got), np.asarray(want))


def test_each_part_compiles_to_a_fraction_of_the_whole_models_temporaries():
    # 8 bfloat16 blocks: the one-program init keeps every parameter's random-number
    # temporaries (Qwen3-0.6B: 5.71 GB for 1.19 GB of weights); a block's program one block's
    config = dataclasses.replace(
        TINY, vocab_size=512, num_layers=8, hidden_dim=256, mlp_dim=768, head_dim=64,
        param_dtype=DType.bfloat16,
    )  # fmt: skip

    def temporaries(fn, *args) -> int:
        return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes

    whole = temporaries(lambda: nnx.state(Transformer(config, rngs=nnx.Rngs(params=0))))
    block = functools.partial(_init_part, Block, config=config)
    part = temporaries(block, jax.random.key(0), np.uint32(0))
    assert part * 4 < whole, (part, whole)
