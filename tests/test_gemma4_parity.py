"""Gemma4 (dense and MoE): the decoder reproduces transformers' Gemma4ForCausalLM logits from
the same checkpoint (fp32, 1e-4), through local sliding-window and global layers with their own
head width, KV heads, proportional RoPE and shared key/value projection; the packed (trainer)
forward equals the masked forward; a checkpoint locoexp saves loads back in transformers."""

import jax.numpy as jnp
import numpy as np
import pytest

from locoexp.model.attention import AttentionSpec
from locoexp.model.checkpoint import load_model, save_checkpoint
from locoexp.model.config import AttentionKind, Family, ModelConfig
from locoexp.model.transformer import causal_segment_mask

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "full_attention"]
# moe, attention_k_eq_v
CASES = {"dense": (False, False), "dense_k_eq_v": (False, True), "moe_k_eq_v": (True, True)}


def build_hf_gemma4(moe: bool, k_eq_v: bool):
    """A float32 eager Gemma4ForCausalLM with every weight (norms, scalars, router) randomised.
    (num_global_key_value_heads applies only with attention_k_eq_v, as in transformers.)"""
    experts = dict(enable_moe_block=True, num_experts=6, top_k_experts=2, moe_intermediate_size=12)
    config = transformers.Gemma4TextConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
        num_global_key_value_heads=1, attention_k_eq_v=k_eq_v, sliding_window=4,
        layer_types=LAYER_TYPES, final_logit_softcapping=30.0, hidden_size_per_layer_input=0,
        rms_norm_eps=1e-6, **(experts if moe else {}),
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Gemma4ForCausalLM(config).float().eval()
    scales = ("norm.weight", "layer_scalar", "router.scale", "per_expert_scale")
    with torch.no_grad():
        scalars = [(n, b) for n, b in model.named_buffers() if n.endswith("layer_scalar")]
        for name, tensor in [*model.named_parameters(), *scalars]:
            if name.endswith(scales) or ("layernorm" in name and name.endswith("weight")):
                tensor.copy_(1.0 + 0.15 * torch.randn_like(tensor))
            else:
                tensor.copy_(0.15 * torch.randn_like(tensor))
    return model


def matching_config(moe: bool, k_eq_v: bool, checkpoint=None) -> ModelConfig:
    experts = dict(
        num_experts=6, experts_per_token=2, expert_mlp_dim=12, router_aux_loss_coef=0.001
    )
    return ModelConfig(
        name="tiny_gemma4", family=Family.gemma4, vocab_size=97, num_layers=4, hidden_dim=32,
        mlp_dim=48, num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10_000.0,
        rms_norm_eps=1e-6, qk_norm=True, tie_embeddings=True, sliding_window=4,
        global_attention_every=3, global_head_dim=16, global_kv_heads=1 if k_eq_v else 2,
        global_rope_theta=1_000_000.0, global_rotary_fraction=0.25, global_key_is_value=k_eq_v,
        final_logit_softcap=30.0, checkpoint=checkpoint, **(experts if moe else {}),
    )  # fmt: skip


def inputs():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 97, size=(2, 12))
    positions = np.stack([np.arange(12), 9000 + np.arange(12)])
    return tokens, positions


def hf_logits(model, tokens, positions):
    with torch.no_grad():
        return model(
            input_ids=torch.tensor(tokens), position_ids=torch.tensor(positions)
        ).logits.numpy()


def locoexp_logits(model, tokens, positions):
    tokens_j = jnp.asarray(tokens)
    hidden, _ = model(
        tokens_j, jnp.asarray(positions), causal_segment_mask(jnp.ones_like(tokens_j))
    )
    return np.asarray(model.logits(hidden))


@pytest.mark.parametrize("name", sorted(CASES))
def test_gemma4_logits_match_transformers_within_1e4(tmp_path, name):
    hf_model = build_hf_gemma4(*CASES[name])
    hf_model.save_pretrained(tmp_path)
    tokens, positions = inputs()
    expected = hf_logits(hf_model, tokens, positions)
    model = load_model(matching_config(*CASES[name], checkpoint=str(tmp_path)), seed=0)
    assert np.abs(expected).max() > 0.5
    np.testing.assert_allclose(locoexp_logits(model, tokens, positions), expected, atol=1e-4)


@pytest.mark.parametrize("kind", [AttentionKind.dense, AttentionKind.blockwise])
def test_gemma4_packed_forward_equals_the_masked_forward(kind):
    model = load_model(matching_config(True, True), seed=1)
    tokens, _ = inputs()
    positions = np.tile(np.arange(12), (2, 1))
    expected = locoexp_logits(model, tokens, positions)
    hidden = model.packed_hidden(
        jnp.asarray(tokens), jnp.asarray(positions), jnp.ones((2, 12), jnp.int32),
        attention=AttentionSpec(kind=kind, block_tokens=8),
    )  # fmt: skip
    np.testing.assert_allclose(np.asarray(model.logits(hidden)), expected, atol=1e-5)


def test_saved_gemma4_checkpoint_loads_in_transformers_with_the_same_logits(tmp_path):
    config = matching_config(True, True)
    model = load_model(config, seed=3)
    save_checkpoint(model, config, str(tmp_path))
    hf_model = transformers.Gemma4ForCausalLM.from_pretrained(tmp_path).float().eval()
    tokens, positions = inputs()
    np.testing.assert_allclose(
        locoexp_logits(model, tokens, positions), hf_logits(hf_model, tokens, positions), atol=1e-4
    )
