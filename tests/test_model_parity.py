"""The decoder reproduces transformers' Qwen3 and Llama logits from the same checkpoint (fp32)."""

import jax.numpy as jnp
import numpy as np
import pytest

from locoexp.model.checkpoint import load_model
from locoexp.model.transformer import causal_segment_mask

torch = pytest.importorskip("torch")
from hf_models import LLAMA3_SCALING, build_hf_model, matching_model_config  # noqa: E402

CASES = {
    # family, heads, kv_heads, head_dim, tied, rope_scaling
    "qwen3_tied_gqa2_wide_heads": ("qwen3", 4, 2, 16, True, None),
    "qwen3_untied_mha": ("qwen3", 4, 4, 8, False, None),
    "qwen3_untied_gqa4": ("qwen3", 8, 2, 8, False, None),
    "llama_untied_gqa4_llama3_rope": ("llama", 8, 2, 4, False, LLAMA3_SCALING),
    "llama_untied_gqa2_llama3_rope_wide_heads": ("llama", 4, 2, 16, False, LLAMA3_SCALING),
    "llama_tied_mha_no_scaling": ("llama", 4, 4, 16, True, None),
}


def hf_and_locoexp_logits(tmp_path, case, tokens, positions):
    family, heads, kv_heads, head_dim, tied, scaling = case
    shape = dict(
        family=family,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        tied=tied,
        rope_scaling=scaling,
    )
    hf_model = build_hf_model(**shape)
    hf_model.save_pretrained(tmp_path)
    with torch.no_grad():
        expected = hf_model(
            input_ids=torch.tensor(tokens), position_ids=torch.tensor(positions)
        ).logits
    model = load_model(matching_model_config(**shape, checkpoint=str(tmp_path)), seed=0)
    tokens_j = jnp.asarray(tokens)
    hidden, _ = model(
        tokens_j, jnp.asarray(positions), causal_segment_mask(jnp.ones_like(tokens_j))
    )
    return expected.numpy(), np.asarray(model.logits(hidden))


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_transformers_within_1e4(tmp_path, name):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 97, size=(2, 12))
    # Positions far past 0 (and past the llama3 original 8192) so every RoPE band matters.
    positions = np.stack([np.arange(12), 9000 + np.arange(12)])
    expected, actual = hf_and_locoexp_logits(tmp_path, CASES[name], tokens, positions)
    assert np.abs(expected).max() > 0.5  # the comparison is not between near-zero logits
    np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=0)
