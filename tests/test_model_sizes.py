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
PAPER_MODELS = [
    *PUBLISHED, "synthetic_100b", "synthetic_200b", "qwen3_30b_a3b", "tiny_qwen3_moe",
    "gemma4_26b", "gemma4_31b", "tiny_gemma4_moe",
]  # fmt: skip


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


def test_qwen3_30b_a3b_total_and_active_counts_are_exact_for_its_published_config():
    """From the published config.json (hidden 2048, 48 layers, 32/4 heads of 128, 128 experts of
    768, top-8, vocab 151936 untied): every tensor of the checkpoint, counted by hand. The model
    card rounds them to 30.5B total, 3.3B activated, 29.9B non-embedding."""
    config = load_model_option("qwen3_30b_a3b")
    d, layers, v, e, k, i = 2048, 48, 151936, 128, 8, 768
    attention = d * 128 * (32 + 4 + 4) + 32 * 128 * d + 2 * 128  # q, k, v, o, q/k norms
    per_expert = 3 * d * i
    block = attention + d * e + e * per_expert + 2 * d  # + router + experts + 2 norms
    active_block = attention + d * e + k * per_expert + 2 * d
    total = 2 * v * d + layers * block + d
    assert sizes.count_parameters(config) == total == 30_532_122_624
    assert sizes.count_active_parameters(config) == 2 * v * d + layers * active_block + d
    assert 3.3e9 <= sizes.count_active_parameters(config) < 3.4e9  # "3.3B"
    assert round((total - 2 * v * d) / 1e8) == 299  # "29.9B non-embedding"
    assert sizes.count_expert_parameters(config) == layers * e * per_expert


def _gemma4_attention(d, heads, kv, h, kv_projections):
    return d * h * (2 * heads + kv_projections * kv) + 2 * h  # q, o, k (, v), q/k norms


def test_gemma4_26b_total_and_active_counts_are_exact_for_its_published_config():
    """The text decoder of google/gemma-4-26B-A4B's config, counted by hand: 25 local layers
    (256-wide heads, 16 q / 8 kv, k and v), 5 global (512-wide, 2 kv, keys as values), a GeLU
    MLP of 2,112, 128 experts of 704 (top-8), router [D, E] + scale [D] + per-expert scale [E],
    7 norms and a layer scalar per layer, a tied 262,144 x 2,816 embedding. The model card
    gives 25.2B total and 3.8B active."""
    config = load_model_option("gemma4_26b")
    d, v, e, k, i = 2816, 262144, 128, 8, 704
    shared = 3 * d * 2112 + 7 * d + 1 + d * e + d + e
    local = _gemma4_attention(d, 16, 8, 256, 2) + shared
    global_ = _gemma4_attention(d, 16, 2, 512, 1) + shared
    total = v * d + 25 * local + 5 * global_ + 30 * e * 3 * d * i + d
    active = v * d + 25 * local + 5 * global_ + 30 * k * 3 * d * i + d
    assert sizes.count_parameters(config) == total == 25_233_141_790
    assert sizes.count_active_parameters(config) == active == 3_822_530_590
    assert [config.is_global_layer(n) for n in range(30)].count(True) == 5


def test_gemma4_31b_count_is_exact_for_its_published_config():
    """google/gemma-4-31B's text decoder by hand (50 local, 10 global layers); card: 30.7B."""
    config = load_model_option("gemma4_31b")
    d, v = 5376, 262144
    shared = 3 * d * 21504 + 4 * d + 1
    local = _gemma4_attention(d, 32, 16, 256, 2) + shared
    global_ = _gemma4_attention(d, 32, 4, 512, 1) + shared
    assert sizes.count_parameters(config) == v * d + 50 * local + 10 * global_ + d
    assert round(sizes.count_parameters(config) / 1e8) == 307
