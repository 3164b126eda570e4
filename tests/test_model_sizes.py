"""Every paper model's parameter count, from `jax.eval_shape`, against its published size."""

import dataclasses

import pytest
from model_options import MODEL_CONF, load_model_option

from locoexp.model import sizes

# name: (published total, published non-embedding or None, digits the total is published to).
# Qwen3: the Hugging Face model cards ("Number of Parameters" / "(Non-Embedding)").
# Llama 3.1: the Llama 3 paper and model cards (70.6B, 405.9B).
PUBLISHED = {
    "qwen3_0_6b": (0.6e9, 0.44e9, 0.1e9),
    "qwen3_1_7b": (1.7e9, 1.4e9, 0.1e9),
    "qwen3_4b": (4.0e9, 3.6e9, 0.1e9),
    "qwen3_8b": (8.2e9, 6.95e9, 0.1e9),
    "qwen3_14b": (14.8e9, 13.2e9, 0.1e9),
    "qwen3_32b": (32.8e9, 31.2e9, 0.1e9),
    "llama3_1_70b": (70.6e9, None, 0.1e9),
    "llama3_1_405b": (405.9e9, None, 0.1e9),
}
PAPER_MODELS = [*PUBLISHED, "synthetic_100b", "synthetic_200b"]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_the_published_total_within_one_percent(name):
    total, non_embedding, unit = PUBLISHED[name]
    config = load_model_option(name)
    count = sizes.count_parameters(config)
    # A total published to one decimal carries up to half a unit of rounding: "1.7B" is 1.72B
    # (1.2% off), so the tolerance is the larger of 1% and that rounding.
    assert abs(count - total) <= max(0.01 * total, unit / 2), f"{name}: {count:,} vs {total:,.0f}"
    assert abs(count - total) <= 0.01 * total or name == "qwen3_1_7b"
    if non_embedding is not None:
        measured = count - sizes.count_embedding_parameters(config)
        assert abs(measured - non_embedding) <= 0.01 * non_embedding, f"{name}: {measured:,}"


@pytest.mark.parametrize(
    ("name", "layers", "approx"), [("synthetic_100b", 31, 100e9), ("synthetic_200b", 62, 200e9)]
)
def test_synthetic_models_are_llama_405b_width_with_the_paper_layer_counts(name, layers, approx):
    config = load_model_option(name)
    width = dataclasses.replace(load_model_option("llama3_1_405b"), name=name, num_layers=layers)
    assert config == width
    d, f, h, k, v = 16384, 53248, 128, 8, 128256
    block = d * 128 * (2 * h + 2 * k) + 3 * d * f + 2 * d
    assert sizes.count_parameters(config) == 2 * v * d + layers * block + d
    assert abs(sizes.count_parameters(config) - approx) <= 0.05 * approx


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_traced_count_equals_the_closed_form(name):
    config = load_model_option(name)
    assert sizes.count_parameters(config) == sizes.count_parameters_by_formula(config)


def test_layer_extrapolation_equals_the_full_trace():
    config = dataclasses.replace(load_model_option("qwen3_0_6b"), num_layers=5)
    assert sizes.count_parameters(config) == sizes.count_traced_parameters(config)


def test_every_model_option_names_itself():
    for path in MODEL_CONF.glob("*.yaml"):
        assert load_model_option(path.stem).name == path.stem
