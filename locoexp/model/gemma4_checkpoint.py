"""Gemma4 text checkpoints (transformers' `Gemma4ForCausalLM`, model_type gemma4_text): tensor
names, config.json fields and the architecture check, for `locoexp.model.checkpoint`.

Names follow what transformers 5 saves: per-layer `layer_scalar`, the four sandwich norms, the
router's `proj`, `scale` and `per_expert_scale`, and the experts fused as `experts.gate_up_proj`
[E, 2I, D] and `experts.down_proj` [E, D, I] (their last two axes swapped into NNX's [in, out]).
Global layers with `attention_k_eq_v` have no v_proj. It maps names; it reads no tensor.
"""

from typing import Any

from locoexp.errors import require
from locoexp.model.config import Family, ModelConfig

Path = tuple[str | int, ...]

_LAYER: dict[str, tuple[Path, bool]] = {
    "self_attn.q_proj.weight": (("attn", "q_proj", "kernel"), True),
    "self_attn.k_proj.weight": (("attn", "k_proj", "kernel"), True),
    "self_attn.v_proj.weight": (("attn", "v_proj", "kernel"), True),
    "self_attn.o_proj.weight": (("attn", "o_proj", "kernel"), True),
    "self_attn.q_norm.weight": (("attn", "q_norm", "scale"), False),
    "self_attn.k_norm.weight": (("attn", "k_norm", "scale"), False),
    "input_layernorm.weight": (("input_norm", "scale"), False),
    "post_attention_layernorm.weight": (("post_attn_norm", "scale"), False),
    "pre_feedforward_layernorm.weight": (("pre_mlp_norm", "scale"), False),
    "post_feedforward_layernorm.weight": (("post_mlp_norm", "scale"), False),
    "mlp.gate_proj.weight": (("mlp", "gate_proj", "kernel"), True),
    "mlp.up_proj.weight": (("mlp", "up_proj", "kernel"), True),
    "mlp.down_proj.weight": (("mlp", "down_proj", "kernel"), True),
    "layer_scalar": (("layer_scalar",), False),
}
_EXPERTS: dict[str, tuple[Path, bool]] = {
    "router.proj.weight": (("experts", "router"), True),
    "router.scale": (("experts", "router_scale"), False),
    "router.per_expert_scale": (("experts", "per_expert_scale"), False),
    "experts.gate_up_proj": (("experts", "gate_up_proj"), True),
    "experts.down_proj": (("experts", "down_proj"), True),
    "post_feedforward_layernorm_1.weight": (("post_mlp_norm_1", "scale"), False),
    "pre_feedforward_layernorm_2.weight": (("pre_experts_norm", "scale"), False),
    "post_feedforward_layernorm_2.weight": (("post_experts_norm", "scale"), False),
}


def gemma4_layer_names(config: ModelConfig, layer: int) -> dict[str, tuple[Path, bool]]:
    """Layer `layer`'s HF tensor names (under model.layers.N) -> (NNX path, transposed)."""
    names = dict(_LAYER)
    if config.is_global_layer(layer) and config.global_key_is_value:
        del names["self_attn.v_proj.weight"]
    return names | (_EXPERTS if config.moe else {})


def _layer_types(config: ModelConfig) -> list[str]:
    return _pattern(config.global_attention_every, config.num_layers)


def _pattern(every: int, layers: int) -> list[str]:
    """HF layer_types: every `every`-th layer and the last global, the others local."""
    return [
        "full_attention" if (i + 1) % every == 0 or i == layers - 1 else "sliding_attention"
        for i in range(layers)
    ]


def gemma4_hf_config(config: ModelConfig) -> dict:
    """The config.json of a Gemma4 `config` (what transformers' Gemma4TextConfig reads)."""
    c = config
    experts = {}
    if c.moe:
        experts = {
            "num_experts": c.num_experts,
            "top_k_experts": c.experts_per_token,
            "moe_intermediate_size": c.expert_mlp_dim,
        }
    return {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_dim,
        "intermediate_size": c.mlp_dim,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "global_head_dim": c.global_head_dim,
        "num_global_key_value_heads": c.global_kv_heads,
        "attention_k_eq_v": c.global_key_is_value,
        "layer_types": _layer_types(c),
        "sliding_window": c.sliding_window,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": c.rope_theta},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": c.global_rotary_fraction,
                "rope_theta": c.global_rope_theta,
            },
        },
        "final_logit_softcapping": c.final_logit_softcap or None,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "enable_moe_block": c.moe,
        **experts,
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": c.tie_embeddings,
        "torch_dtype": c.param_dtype.value,
    }


def _global_geometry(hf: dict) -> tuple[int, int]:
    """(global head width, global KV heads) from config.json: the published keys, or the
    per_layer_config that transformers 5 writes instead."""
    if "global_head_dim" in hf:
        kv = hf.get("num_global_key_value_heads") or hf["num_key_value_heads"]
        return hf["global_head_dim"], kv if hf.get("attention_k_eq_v") else hf[
            "num_key_value_heads"
        ]
    overrides: dict[str, Any] = next(iter((hf.get("per_layer_config") or {}).values()), {})
    return (
        overrides.get("head_dim", hf["head_dim"]),
        overrides.get("num_key_value_heads", hf["num_key_value_heads"]),
    )


def gemma4_architecture(hf: dict) -> dict:
    """A gemma4_text config.json -> the `ModelConfig` fields it determines."""
    require(
        not hf.get("hidden_size_per_layer_input") and not hf.get("num_kv_shared_layers"),
        "config.json uses per-layer input embeddings or shared KV layers (Gemma4 E2B/E4B): "
        "locoexp implements the Gemma4 text decoder without them (the 31B and 26B models).",
    )
    require(
        hf.get("hidden_activation", "gelu_pytorch_tanh") == "gelu_pytorch_tanh"
        and not hf.get("use_double_wide_mlp")
        and not hf.get("attention_bias")
        and hf.get("use_bidirectional_attention") is None,
        "config.json sets an activation, double-wide MLP, attention bias or bidirectional "
        "attention that locoexp's Gemma4 block does not implement.",
    )
    rope = hf["rope_parameters"]
    local, full = rope["sliding_attention"], rope["full_attention"]
    global_head_dim, global_kv_heads = _global_geometry(hf)
    layer_types, layers = hf["layer_types"], hf["num_hidden_layers"]
    every = layer_types.index("full_attention") + 1
    require(
        layer_types == _pattern(every, layers),
        f"config.json layer_types is not every {every}-th layer global (and the last): "
        "locoexp's Gemma4 takes that pattern only.",
    )
    fields = {
        "family": Family.gemma4,
        "vocab_size": hf["vocab_size"],
        "num_layers": hf["num_hidden_layers"],
        "hidden_dim": hf["hidden_size"],
        "mlp_dim": hf["intermediate_size"],
        "num_heads": hf["num_attention_heads"],
        "num_kv_heads": hf["num_key_value_heads"],
        "head_dim": hf["head_dim"],
        "rms_norm_eps": hf["rms_norm_eps"],
        "tie_embeddings": hf.get("tie_word_embeddings", True),
        "rope_theta": local["rope_theta"],
        "sliding_window": hf["sliding_window"],
        "global_attention_every": every,
        "global_head_dim": global_head_dim,
        "global_kv_heads": global_kv_heads,
        "global_rope_theta": full["rope_theta"],
        "global_rotary_fraction": full.get("partial_rotary_factor", 1.0),
        "global_key_is_value": hf.get("attention_k_eq_v", False),
        "final_logit_softcap": hf.get("final_logit_softcapping") or 0.0,
        "num_experts": (hf.get("num_experts") or 0) if hf.get("enable_moe_block") else 0,
    }
    if fields["num_experts"]:
        fields |= {
            "experts_per_token": hf["top_k_experts"],
            "expert_mlp_dim": hf["moe_intermediate_size"],
        }
    return fields
