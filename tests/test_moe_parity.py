"""Qwen3-MoE: the decoder reproduces transformers' logits from the same checkpoint (fp32), the
router's load-balancing loss equals transformers' `load_balancing_loss_func`, and a checkpoint
locoexp saves loads back in transformers with the same logits."""

import jax.numpy as jnp
import numpy as np
import pytest

from locoexp.model.checkpoint import load_model, save_checkpoint
from locoexp.model.config import ModelConfig
from locoexp.model.transformer import causal_segment_mask, router_loss

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# experts, top-k, norm_topk_prob, tied
CASES = {
    "8_experts_top2_normalised": (8, 2, True, False),
    "4_experts_top1_raw_weights": (4, 1, False, False),
    "6_experts_top3_tied": (6, 3, True, True),
}


def build_hf_moe(experts: int, top_k: int, normalise: bool, tied: bool):
    """A float32 eager Qwen3-MoE with every weight (norms and router included) randomised."""
    config = transformers.Qwen3MoeConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, moe_intermediate_size=24,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=normalise,
        tie_word_embeddings=tied, rms_norm_eps=1e-6, max_position_embeddings=16384,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = 0.15 * torch.randn_like(param)
            param.copy_(1.0 + noise if name.endswith("norm.weight") else noise)
    return model


def matching_config(experts, top_k, normalise, tied, checkpoint=None) -> ModelConfig:
    return ModelConfig(
        name="tiny_qwen3_moe", vocab_size=97, num_layers=2, hidden_dim=32, mlp_dim=48,
        num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        qk_norm=True, tie_embeddings=tied, num_experts=experts, experts_per_token=top_k,
        expert_mlp_dim=24, normalize_top_k=normalise, router_aux_loss_coef=0.001,
        checkpoint=checkpoint,
    )  # fmt: skip


def locoexp_logits(model, tokens, positions):
    tokens_j = jnp.asarray(tokens)
    hidden, _ = model(
        tokens_j, jnp.asarray(positions), causal_segment_mask(jnp.ones_like(tokens_j))
    )
    return np.asarray(model.logits(hidden))


def inputs():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 97, size=(2, 12))
    positions = np.stack([np.arange(12), 9000 + np.arange(12)])
    return tokens, positions


@pytest.mark.parametrize("name", sorted(CASES))
def test_moe_logits_match_transformers_within_1e4(tmp_path, name):
    hf_model = build_hf_moe(*CASES[name])
    hf_model.save_pretrained(tmp_path)
    tokens, positions = inputs()
    with torch.no_grad():
        expected = hf_model(
            input_ids=torch.tensor(tokens), position_ids=torch.tensor(positions)
        ).logits.numpy()
    model = load_model(matching_config(*CASES[name], checkpoint=str(tmp_path)), seed=0)
    actual = locoexp_logits(model, tokens, positions)
    assert np.abs(expected).max() > 0.5
    np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=0)


def test_router_loss_matches_transformers_load_balancing_loss(tmp_path):
    case = CASES["8_experts_top2_normalised"]
    hf_model = build_hf_moe(*case)
    hf_model.save_pretrained(tmp_path)
    tokens = np.random.default_rng(1).integers(1, 97, size=(2, 10))
    segment_ids = np.ones_like(tokens)
    segment_ids[1, 7:] = 0  # padding: excluded on both sides through the mask
    positions = np.tile(np.arange(10), (2, 1))
    with torch.no_grad():
        out = hf_model(
            input_ids=torch.tensor(tokens),
            attention_mask=torch.tensor(segment_ids),
            position_ids=torch.tensor(positions),
            output_router_logits=True,
        )
    model = load_model(matching_config(*case, checkpoint=str(tmp_path)), seed=0)
    from locoexp.model.attention import AttentionSpec

    _, stats = model.packed_hidden_and_router(
        jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids),
        attention=AttentionSpec(),
    )  # fmt: skip
    assert float(out.aux_loss) > 1.0  # top-2 routing: 2 at perfect balance, more when skewed
    np.testing.assert_allclose(float(router_loss(stats)), float(out.aux_loss), rtol=1e-5)


def test_saved_moe_checkpoint_loads_in_transformers_with_the_same_logits(tmp_path):
    config = matching_config(8, 2, True, False)
    model = load_model(config, seed=3)
    save_checkpoint(model, config, str(tmp_path))
    hf_model = transformers.Qwen3MoeForCausalLM.from_pretrained(tmp_path).float().eval()
    tokens, positions = inputs()
    with torch.no_grad():
        expected = hf_model(
            input_ids=torch.tensor(tokens), position_ids=torch.tensor(positions)
        ).logits.numpy()
    np.testing.assert_allclose(
        locoexp_logits(model, tokens, positions), expected, atol=1e-4, rtol=0
    )
