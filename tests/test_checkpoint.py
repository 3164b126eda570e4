"""Hugging Face checkpoint directories: load, architecture check, save, round trips."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_options import load_model_option

from locoexp.errors import ConfigError
from locoexp.model.checkpoint import (
    INDEX_FILE,
    SINGLE_FILE,
    check_architecture,
    load_model,
    save_checkpoint,
)
from locoexp.model.config import DType, ModelConfig
from locoexp.model.transformer import build_model, causal_segment_mask

TINY = ModelConfig(
    name="tiny_test",
    vocab_size=50,
    num_layers=2,
    hidden_dim=32,
    mlp_dim=48,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
)


def random_model(config: ModelConfig, *, seed: int, std: float = 0.2):
    """A decoder with numpy-random weights (no jitted init to compile: tests stay fast)."""
    rng = np.random.default_rng(seed)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: build_model(config, seed=0)))
    leaves = [
        (key, var.replace(jnp.asarray(rng.normal(0.0, std, var.shape), var.dtype)))
        for key, var in nnx.to_flat_state(state)
    ]
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def flat_params(model) -> dict:
    return {k: np.asarray(v[...]) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def assert_same_params(a, b):
    pa, pb = flat_params(a), flat_params(b)
    assert pa.keys() == pb.keys()
    for key in pa:
        assert pa[key].dtype == pb[key].dtype, key
        np.testing.assert_array_equal(pa[key], pb[key], err_msg=str(key))


@pytest.mark.parametrize("tied", [True, False])
def test_save_then_load_gives_identical_parameters(tmp_path, tied):
    config = dataclasses.replace(TINY, tie_embeddings=tied)
    model = random_model(config, seed=3)
    save_checkpoint(model, config, str(tmp_path))
    assert (tmp_path / SINGLE_FILE).is_file() and not (tmp_path / INDEX_FILE).exists()
    loaded = load_model(dataclasses.replace(config, checkpoint=str(tmp_path)), seed=0)
    assert_same_params(model, loaded)


def test_sharded_save_writes_an_index_and_loads_identically(tmp_path):
    model = random_model(TINY, seed=1)
    save_checkpoint(model, TINY, str(tmp_path), max_shard_bytes=20_000)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) > 1 and not (tmp_path / SINGLE_FILE).exists()
    assert_same_params(
        model, load_model(dataclasses.replace(TINY, checkpoint=str(tmp_path)), seed=0)
    )


def test_bfloat16_parameters_round_trip_bit_exactly(tmp_path):
    config = dataclasses.replace(TINY, param_dtype=DType.bfloat16)
    model = random_model(config, seed=2)
    save_checkpoint(model, config, str(tmp_path))
    loaded = load_model(dataclasses.replace(config, checkpoint=str(tmp_path)), seed=0)
    assert loaded.embed.embedding[...].dtype == jnp.bfloat16
    assert_same_params(model, loaded)


def test_without_checkpoint_load_model_is_the_seeded_random_init():
    assert_same_params(load_model(TINY, seed=5), build_model(TINY, seed=5))


def test_architecture_mismatch_names_every_differing_key(tmp_path):
    save_checkpoint(random_model(TINY, seed=0), TINY, str(tmp_path))
    wrong = dataclasses.replace(TINY, num_heads=8, rope_theta=1e6, checkpoint=str(tmp_path))
    with pytest.raises(ConfigError, match="model.checkpoint=") as error:
        load_model(wrong, seed=0)
    message = str(error.value)
    assert "model.num_heads=8 but the checkpoint has 4" in message
    assert "model.rope_theta" in message and "model.vocab_size" not in message


# The architecture keys of the published config.json files (Qwen/Qwen3-*, meta-llama/Llama-3.1-*),
# in the transformers 4.x layout the hub serves.
QWEN3 = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "head_dim": 128,
    "hidden_act": "silu",
    "attention_bias": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "num_key_value_heads": 8,
}
LLAMA31 = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_act": "silu",
    "mlp_bias": False,
    "attention_bias": False,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}
PUBLISHED_CONFIGS = {
    "qwen3_0_6b": QWEN3
    | {
        "num_hidden_layers": 28,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "tie_word_embeddings": True,
    },
    "qwen3_8b": QWEN3
    | {
        "num_hidden_layers": 36,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_attention_heads": 32,
        "tie_word_embeddings": False,
    },
    "llama3_1_70b": LLAMA31
    | {
        "num_hidden_layers": 80,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_attention_heads": 64,
    },
    "llama3_1_405b": LLAMA31
    | {
        "num_hidden_layers": 126,
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "num_attention_heads": 128,
    },
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONFIGS))
def test_published_config_json_matches_the_model_option(name):
    check_architecture(PUBLISHED_CONFIGS[name], load_model_option(name), "<hub>")


def test_unsupported_rope_scaling_is_refused_naming_model_checkpoint():
    yarn = PUBLISHED_CONFIGS["qwen3_8b"] | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(
        ConfigError, match=r"^model\.checkpoint=<hub>: config.json rope_type='yarn'"
    ):
        check_architecture(yarn, load_model_option("qwen3_8b"), "<hub>")


def test_missing_directory_or_files_are_refused_naming_model_checkpoint(tmp_path):
    for directory in (tmp_path / "absent", tmp_path):
        with pytest.raises(ConfigError, match=r"^model\.checkpoint="):
            load_model(dataclasses.replace(TINY, checkpoint=str(directory)), seed=0)
    save_checkpoint(random_model(TINY, seed=0), TINY, str(tmp_path))
    (tmp_path / SINGLE_FILE).unlink()
    with pytest.raises(ConfigError, match=f"neither {SINGLE_FILE}"):
        load_model(dataclasses.replace(TINY, checkpoint=str(tmp_path)), seed=0)


def test_transformers_sharded_checkpoint_loads_like_the_single_file(tmp_path):
    pytest.importorskip("torch")
    from hf_models import build_hf_model, matching_model_config

    shape = dict(family="qwen3", heads=4, kv_heads=2, head_dim=16, tied=False)
    hf_model = build_hf_model(**shape)
    hf_model.save_pretrained(tmp_path / "single")
    hf_model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / INDEX_FILE).is_file()
    single = load_model(matching_model_config(**shape, checkpoint=str(tmp_path / "single")), seed=0)
    sharded = load_model(
        matching_model_config(**shape, checkpoint=str(tmp_path / "sharded")), seed=0
    )
    assert_same_params(single, sharded)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_transformers_loads_what_locoexp_saves_with_the_same_logits(tmp_path, family):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hf_models import LLAMA3_SCALING, matching_model_config

    config = matching_model_config(
        family=family,
        heads=4,
        kv_heads=2,
        head_dim=16,
        tied=family == "qwen3",
        rope_scaling=LLAMA3_SCALING if family == "llama" else None,
    )
    model = random_model(config, seed=4)
    save_checkpoint(model, config, str(tmp_path))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="eager"
    )
    tokens = jax.random.randint(jax.random.key(0), (2, 10), 0, config.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(10) + 9000, tokens.shape)
    hidden, _ = model(tokens, positions, causal_segment_mask(jnp.ones_like(tokens)))
    with torch.no_grad():
        expected = (
            hf_model(
                input_ids=torch.tensor(np.asarray(tokens)),
                position_ids=torch.tensor(np.asarray(positions)),
            )
            .logits.float()
            .numpy()
        )
    np.testing.assert_allclose(np.asarray(model.logits(hidden)), expected, atol=1e-4, rtol=0)
