"""Test helper: tiny random transformers Qwen3 / Llama models and their locoexp `ModelConfig`."""

import pytest

from locoexp.model.config import ModelConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def build_hf_model(
    *,
    family: str,
    heads: int,
    kv_heads: int,
    head_dim: int,
    tied: bool,
    rope_scaling: dict | None = None,
    seed: int = 0,
):
    """A float32 eager-attention model with every weight (norms included) randomised."""
    common = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        max_position_embeddings=16384,
    )
    if family == "qwen3":
        config = transformers.Qwen3Config(rope_theta=1_000_000.0, **common)
        model_cls = transformers.Qwen3ForCausalLM
    else:
        config = transformers.LlamaConfig(rope_theta=500_000.0, rope_scaling=rope_scaling, **common)
        model_cls = transformers.LlamaForCausalLM
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = 0.15 * torch.randn_like(param)
            param.copy_(1.0 + noise if name.endswith("norm.weight") else noise)
    return model


def matching_model_config(
    *,
    family: str,
    heads: int,
    kv_heads: int,
    head_dim: int,
    tied: bool,
    rope_scaling: dict | None = None,
    checkpoint: str | None = None,
) -> ModelConfig:
    """The locoexp config of `build_hf_model` with the same arguments."""
    scaling = {}
    if rope_scaling is not None:
        scaling = dict(
            rope_scaling_factor=rope_scaling["factor"],
            rope_low_freq_factor=rope_scaling["low_freq_factor"],
            rope_high_freq_factor=rope_scaling["high_freq_factor"],
            rope_original_max_positions=rope_scaling["original_max_position_embeddings"],
        )
    return ModelConfig(
        name=f"tiny_{family}",
        vocab_size=97,
        num_layers=2,
        hidden_dim=32,
        mlp_dim=48,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=1_000_000.0 if family == "qwen3" else 500_000.0,
        rms_norm_eps=1e-6,
        qk_norm=family == "qwen3",
        tie_embeddings=tied,
        checkpoint=checkpoint,
        **scaling,
    )
