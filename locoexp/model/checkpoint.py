"""Hugging Face checkpoint directories <-> the NNX decoder, and `load_model`.

A checkpoint directory is what `save_pretrained` writes and what users download: `config.json`
plus `model.safetensors`, or shards listed in `model.safetensors.index.json`. Loading checks the
directory's architecture against the selected `ModelConfig` (the YAML option is the source of
truth; the checkpoint must match it), maps tensor names, transposes linear weights (HF Linear
stores [out, in]; NNX kernels are [in, out]) and casts to `model.param_dtype`. Saving writes the
same format back, so transformers can load what locoexp trained.

Weights go through `safetensors` only: never pickle, never a hub download (a Hub id is
resolved from the local cache by `locoexp.model.hub`).
"""

import json
import math
import pathlib
import re
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from locoexp.errors import ConfigError, require
from locoexp.model.config import ModelConfig
from locoexp.model.gemma4_checkpoint import (
    gemma4_architecture,
    gemma4_hf_config,
    gemma4_layer_names,
)
from locoexp.model.hub import resolve_checkpoint
from locoexp.model.transformer import Transformer, build_model

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")  # refused, never unpickled

# An NNX parameter path, e.g. ("layers", 0, "attn", "q_proj", "kernel").
Path = tuple[str | int, ...]

# Per block: HF name under model.layers.N -> (NNX path under layers[N], stored as HF [out, in]).
_BLOCK: dict[str, tuple[Path, bool]] = {
    "self_attn.q_proj.weight": (("attn", "q_proj", "kernel"), True),
    "self_attn.k_proj.weight": (("attn", "k_proj", "kernel"), True),
    "self_attn.v_proj.weight": (("attn", "v_proj", "kernel"), True),
    "self_attn.o_proj.weight": (("attn", "o_proj", "kernel"), True),
    "mlp.gate_proj.weight": (("mlp", "gate_proj", "kernel"), True),
    "mlp.up_proj.weight": (("mlp", "up_proj", "kernel"), True),
    "mlp.down_proj.weight": (("mlp", "down_proj", "kernel"), True),
    "input_layernorm.weight": (("input_norm", "scale"), False),
    "post_attention_layernorm.weight": (("post_attn_norm", "scale"), False),
}
_QK_NORM: dict[str, tuple[Path, bool]] = {  # Qwen3 only
    "self_attn.q_norm.weight": (("attn", "q_norm", "scale"), False),
    "self_attn.k_norm.weight": (("attn", "k_norm", "scale"), False),
}
_DENSE_MLP = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
# Qwen3-MoE: the router, and expert j's projections as slice j of the stacked [E, ...] kernels
# (a path ending in the expert index; `_stack_experts` assembles them).
_ROUTER: dict[str, tuple[Path, bool]] = {"mlp.gate.weight": (("mlp", "router"), True)}
_EXPERT: dict[str, tuple[Path, bool]] = {
    "gate_proj.weight": (("mlp", "gate_proj"), True),
    "up_proj.weight": (("mlp", "up_proj"), True),
    "down_proj.weight": (("mlp", "down_proj"), True),
}


def _block_names(config: ModelConfig) -> dict[str, tuple[Path, bool]]:
    """One block's HF tensor names (under model.layers.N) -> (NNX path, transposed)."""
    block = _BLOCK | (_QK_NORM if config.qk_norm else {})
    if not config.moe:
        return block
    block = {name: entry for name, entry in block.items() if name not in _DENSE_MLP} | _ROUTER
    for j in range(config.num_experts):
        for name, (path, transpose) in _EXPERT.items():
            block[f"mlp.experts.{j}.{name}"] = ((*path, j), transpose)
    return block


def _expert_slice(path: Path) -> tuple[Path, int] | None:
    """(stacked parameter path, expert index) when `path` names one expert's slice."""
    if len(path) == 5 and path[2] == "mlp" and isinstance(path[4], int):
        return path[:4], path[4]
    return None


def _stack_experts(params: dict[Path, np.ndarray]) -> dict[Path, np.ndarray]:
    """Per-expert [D, I] / [I, D] slices -> the stacked [E, D, I] / [E, I, D] parameters."""
    slices: dict[Path, dict[int, np.ndarray]] = {}
    stacked = {}
    for path, array in params.items():
        owner = _expert_slice(path)
        if owner is None:
            stacked[path] = array
        else:
            slices.setdefault(owner[0], {})[owner[1]] = array
    for path, by_expert in slices.items():
        stacked[path] = np.stack([by_expert[j] for j in range(len(by_expert))])
    return stacked


def tensor_names(config: ModelConfig) -> dict[str, tuple[Path, bool]]:
    """HF tensor name -> (NNX parameter path, whether the HF tensor is a transposed kernel)."""
    names: dict[str, tuple[Path, bool]] = {
        "model.embed_tokens.weight": (("embed", "embedding"), False),
        "model.norm.weight": (("final_norm", "scale"), False),
    }
    if not config.tie_embeddings:
        names["lm_head.weight"] = (("lm_head", "kernel"), True)
    for i in range(config.num_layers):
        block = gemma4_layer_names(config, i) if config.gemma4 else _block_names(config)
        for name, (path, transpose) in block.items():
            names[f"model.layers.{i}.{name}"] = (("layers", i, *path), transpose)
    return names


def hf_config(config: ModelConfig) -> dict:
    """The config.json of `config`, in the keys Qwen3 / Llama / Gemma4 checkpoints use."""
    if config.gemma4:
        return gemma4_hf_config(config)
    rope_scaling = None
    if config.rope_scaling_factor != 1.0:
        rope_scaling = {
            "rope_type": "llama3",
            "factor": config.rope_scaling_factor,
            "low_freq_factor": config.rope_low_freq_factor,
            "high_freq_factor": config.rope_high_freq_factor,
            "original_max_position_embeddings": config.rope_original_max_positions,
        }
    model_type = "qwen3" if config.qk_norm else "llama"
    architecture = "Qwen3ForCausalLM" if config.qk_norm else "LlamaForCausalLM"
    experts = {}
    if config.moe:
        model_type, architecture = "qwen3_moe", "Qwen3MoeForCausalLM"
        experts = {
            "num_experts": config.num_experts,
            "num_experts_per_tok": config.experts_per_token,
            "moe_intermediate_size": config.expert_mlp_dim,
            "norm_topk_prob": config.normalize_top_k,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "router_aux_loss_coef": config.router_aux_loss_coef,
        }
    return {
        "architectures": [architecture],
        "model_type": model_type,
        **experts,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_dim,
        "intermediate_size": config.mlp_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": config.tie_embeddings,
        "torch_dtype": config.param_dtype.value,
    }


def _rope(hf: dict) -> dict:
    """Rope settings from transformers 5 `rope_parameters` or 4.x `rope_theta` + `rope_scaling`."""
    rope = dict(hf.get("rope_parameters") or {})
    rope.setdefault("rope_theta", hf.get("rope_theta", 10_000.0))
    rope.update(hf.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    require(
        rope_type in ("default", "llama3"),
        f"config.json rope_type={rope_type!r} is not supported: locoexp implements "
        "'default' and 'llama3'.",
    )
    if rope_type == "default":
        return {"rope_theta": rope["rope_theta"], "rope_scaling_factor": 1.0}
    return {
        "rope_theta": rope["rope_theta"],
        "rope_scaling_factor": rope["factor"],
        "rope_low_freq_factor": rope["low_freq_factor"],
        "rope_high_freq_factor": rope["high_freq_factor"],
        "rope_original_max_positions": rope["original_max_position_embeddings"],
    }


def architecture_of(hf: dict) -> dict:
    """config.json -> the `ModelConfig` fields it determines (same names as the schema)."""
    model_type = hf.get("model_type")
    require(
        model_type in ("qwen3", "llama", "qwen3_moe", "gemma4_text"),
        f"config.json model_type={model_type!r} is not supported: locoexp loads "
        "'qwen3', 'qwen3_moe', 'llama' and 'gemma4_text'.",
    )
    if model_type == "gemma4_text":
        return gemma4_architecture(hf)
    require(
        not hf.get("attention_bias", False) and not hf.get("mlp_bias", False),
        "config.json has attention_bias or mlp_bias set: the locoexp decoder has no biases.",
    )
    require(
        hf.get("hidden_act", "silu") == "silu",
        f"config.json hidden_act={hf.get('hidden_act')!r} is not supported: "
        "the MLP is SwiGLU (silu).",
    )
    heads = hf["num_attention_heads"]
    return {
        "vocab_size": hf["vocab_size"],
        "num_layers": hf["num_hidden_layers"],
        "hidden_dim": hf["hidden_size"],
        "mlp_dim": hf["intermediate_size"],
        "num_heads": heads,
        "num_kv_heads": hf.get("num_key_value_heads") or heads,
        "head_dim": hf.get("head_dim") or hf["hidden_size"] // heads,
        "rms_norm_eps": hf["rms_norm_eps"],
        "qk_norm": model_type in ("qwen3", "qwen3_moe"),
        "tie_embeddings": hf.get("tie_word_embeddings", False),
        **_rope(hf),
        **(_experts(hf) if model_type == "qwen3_moe" else {}),
    }


def _experts(hf: dict) -> dict:
    """A qwen3_moe config.json's expert fields (every block sparse, as Qwen3-30B-A3B)."""
    require(
        hf.get("decoder_sparse_step", 1) == 1 and not hf.get("mlp_only_layers"),
        "config.json has decoder_sparse_step != 1 or mlp_only_layers: locoexp's Qwen3-MoE makes "
        "every block sparse.",
    )
    require(
        not hf.get("use_sliding_window", False),
        "config.json has use_sliding_window set: locoexp's Qwen3-MoE attends over full rows.",
    )
    return {
        "num_experts": hf.get("num_experts") or hf["num_local_experts"],
        "experts_per_token": hf["num_experts_per_tok"],
        "expert_mlp_dim": hf["moe_intermediate_size"],
        "normalize_top_k": hf.get("norm_topk_prob", False),
    }


def check_architecture(hf: dict, config: ModelConfig, directory: str) -> None:
    """Raise ConfigError naming every key where config.json and the selected model disagree."""
    try:
        architecture = architecture_of(hf)
    except ConfigError as error:
        raise ConfigError(f"model.checkpoint={directory}: {error}") from None
    mismatches = []
    for key, value in architecture.items():
        selected = getattr(config, key)
        same = (
            math.isclose(value, selected, rel_tol=1e-9)
            if isinstance(value, float)
            else value == selected
        )
        if not same:
            mismatches.append(f"model.{key}={selected} but the checkpoint has {value}")
    require(
        not mismatches,
        f"model.checkpoint={directory} does not match the selected model "
        f"model.name={config.name}: {'; '.join(mismatches)}; select the matching model option "
        "or override these keys.",
    )


def read_json(file: pathlib.Path, directory: str) -> dict:
    """A JSON file of the checkpoint; an unreadable or malformed one is named in one sentence."""
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"model.checkpoint={directory}: {file.name} is not valid JSON (line {error.lineno}, "
            f"column {error.colno}: {error.msg}); re-download or re-save the checkpoint."
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            f"model.checkpoint={directory}: {file.name} cannot be read ({error})."
        ) from None


def _shard_files(directory: pathlib.Path) -> list[pathlib.Path]:
    if (directory / INDEX_FILE).is_file():
        weight_map = read_json(directory / INDEX_FILE, str(directory)).get("weight_map")
        if not (isinstance(weight_map, dict) and weight_map):
            raise ConfigError(
                f"model.checkpoint={directory}: {INDEX_FILE} has no weight_map of tensor -> file."
            )
        return [directory / name for name in sorted(set(weight_map.values()))]
    pickled = [name for name in PICKLE_FILES if (directory / name).is_file()]
    require(
        not pickled,
        f"model.checkpoint={directory} holds only {pickled[0] if pickled else ''}, a pickle that "
        'locoexp never loads; convert it to safetensors with `python -c "from transformers import '
        f"AutoModelForCausalLM as M; M.from_pretrained('{directory}').save_pretrained("
        f"'{directory}', safe_serialization=True)\"`.",
    )
    require(
        (directory / SINGLE_FILE).is_file(),
        f"model.checkpoint={directory} has neither {SINGLE_FILE} nor {INDEX_FILE}.",
    )
    return [directory / SINGLE_FILE]


def open_shard(file: pathlib.Path, directory: pathlib.Path):
    """`safe_open` of one weight file; a missing, truncated or non-safetensors file is named."""
    require(file.is_file(), f"model.checkpoint={directory} lists the missing shard {file.name}.")
    try:
        return safe_open(str(file), framework="numpy")
    except (SafetensorError, OSError) as error:
        raise ConfigError(
            f"model.checkpoint={directory}: {file.name} is not a readable safetensors file "
            f"({error}); it is truncated or not safetensors, so re-download or re-save it."
        ) from None


def _ignored(name: str, config: ModelConfig) -> bool:
    """Tensors a valid checkpoint may carry that the model does not hold."""
    return name.endswith("rotary_emb.inv_freq") or (
        name == "lm_head.weight" and config.tie_embeddings
    )


def read_parameters(directory: pathlib.Path, config: ModelConfig) -> dict[Path, np.ndarray]:
    """All parameters of the checkpoint as NNX-layout numpy arrays keyed by NNX path."""
    names = tensor_names(config)
    params: dict[Path, np.ndarray] = {}
    for file in _shard_files(directory):
        with open_shard(file, directory) as shard:
            for name in shard.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if _ignored(name, config):
                    continue
                require(
                    name in names, f"model.checkpoint={directory} has the unexpected tensor {name}."
                )
                path, transpose = names[name]
                tensor = shard.get_tensor(name)
                params[path] = np.swapaxes(tensor, -1, -2) if transpose else tensor
    missing = sorted(name for name, (path, _) in names.items() if path not in params)
    require(
        not missing, f"model.checkpoint={directory} lacks the tensor(s) {', '.join(missing[:5])}."
    )
    return _stack_experts(params)


def load_checkpoint(config: ModelConfig, directory: str) -> Transformer:
    """The decoder with the weights of a Hugging Face checkpoint directory."""
    path = pathlib.Path(directory)
    require(path.is_dir(), f"model.checkpoint={directory} is not a directory.")
    require((path / CONFIG_FILE).is_file(), f"model.checkpoint={directory} has no {CONFIG_FILE}.")
    check_architecture(read_json(path / CONFIG_FILE, directory), config, directory)
    # keyed by NNX path: the flat state's keys are the same tuples of names and indices
    params: dict[tuple[Any, ...], np.ndarray] = read_parameters(path, config)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: build_model(config, seed=0)))
    leaves = []
    for key, variable in nnx.to_flat_state(state):
        array = params[key]
        require(
            array.shape == variable.shape,
            f"model.checkpoint={directory}: parameter {'.'.join(map(str, key))} has shape "
            f"{array.shape}, but the selected model needs {variable.shape}.",
        )
        leaves.append((key, variable.replace(jnp.asarray(array, variable.dtype))))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def save_checkpoint(
    model: Transformer, config: ModelConfig, directory: str, *, max_shard_bytes: int = 4 << 30
) -> None:
    """Write config.json and safetensors (sharded with an index past `max_shard_bytes`)."""
    path = pathlib.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    state = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, (key, transpose) in tensor_names(config).items():
        expert = _expert_slice(key)
        array = np.asarray(state[key][...] if expert is None else state[expert[0]][...][expert[1]])
        array = np.ascontiguousarray(np.swapaxes(array, -1, -2) if transpose else array)
        if shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    (path / CONFIG_FILE).write_text(json.dumps(hf_config(config), indent=2) + "\n")
    if len(shards) == 1:
        save_file(shards[0], str(path / SINGLE_FILE), metadata={"format": "pt"})
        return
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shard, file)
        total += sum(a.nbytes for a in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> its shape in a checkpoint of `config` (HF Linear: [out, in])."""
    if config.gemma4:
        return _traced_hf_shapes(config)
    d, f, hd, v = config.hidden_dim, config.mlp_dim, config.head_dim, config.vocab_size
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    per_block = {
        "self_attn.q_proj.weight": (q, d),
        "self_attn.k_proj.weight": (kv, d),
        "self_attn.v_proj.weight": (kv, d),
        "self_attn.o_proj.weight": (d, q),
        "mlp.gate_proj.weight": (f, d),
        "mlp.up_proj.weight": (f, d),
        "mlp.down_proj.weight": (d, f),
        "input_layernorm.weight": (d,),
        "post_attention_layernorm.weight": (d,),
        "self_attn.q_norm.weight": (hd,),
        "self_attn.k_norm.weight": (hd,),
        "mlp.gate.weight": (config.num_experts, d),
        "mlp.experts.*.gate_proj.weight": (config.expert_mlp_dim, d),
        "mlp.experts.*.up_proj.weight": (config.expert_mlp_dim, d),
        "mlp.experts.*.down_proj.weight": (d, config.expert_mlp_dim),
    }
    shapes = {
        "model.embed_tokens.weight": (v, d),
        "model.norm.weight": (d,),
        "lm_head.weight": (v, d),
    }
    for name in tensor_names(config):
        if name.startswith("model.layers."):
            shapes[name] = per_block[re.sub(r"experts\.\d+\.", "experts.*.", name.split(".", 3)[3])]
    return {name: shapes[name] for name in tensor_names(config)}


def check_checkpoint(config: ModelConfig) -> None:
    """Every refusal `load_model` would make, from config.json and the safetensors headers only
    (no tensor is read): directory, JSON files, architecture, weight files, tensor names and
    shapes. `locoexp.preflight` runs it before the run directory exists."""
    if config.checkpoint is None:
        return
    path = resolve_checkpoint(config.checkpoint)  # a directory, or a Hub id in the local cache
    directory = str(path)
    require((path / CONFIG_FILE).is_file(), f"model.checkpoint={directory} has no {CONFIG_FILE}.")
    check_architecture(read_json(path / CONFIG_FILE, directory), config, directory)
    expected, found = hf_shapes(config), {}
    for file in _shard_files(path):
        with open_shard(file, path) as shard:
            for name in shard.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if not _ignored(name, config):
                    found[name] = (file.name, tuple(shard.get_slice(name).get_shape()))
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        raise ConfigError(
            f"model.checkpoint={directory} has the unexpected tensor {unexpected[0]}."
        )
    missing = sorted(set(expected) - set(found))
    require(
        not missing,
        f"model.checkpoint={directory} lacks the tensor(s) {', '.join(missing[:5])}.",
    )
    for name, (file_name, shape) in found.items():
        require(
            shape == expected[name],
            f"model.checkpoint={directory}: {file_name} holds {name} with shape {shape}, but the "
            f"selected model needs {expected[name]}.",
        )


def load_model(config: ModelConfig, *, seed: int) -> Transformer:
    """Random init when `config.checkpoint` is None, else the weights of that directory or cached
    Hub id (`locoexp.model.hub`)."""
    if config.checkpoint is None:
        return build_model(config, seed=seed)
    return load_checkpoint(config, str(resolve_checkpoint(config.checkpoint)))


def _traced_hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape, read off the traced model (`jax.eval_shape`, nothing allocated);
    once per architecture: the plan asks for every candidate size (46 times in a LoRA plan,
    0.15 s each on a tiny Gemma4)."""
    key = repr(config)  # ModelConfig is not hashable
    if key not in _TRACED_SHAPES:
        _TRACED_SHAPES[key] = _trace_hf_shapes(config)
    return dict(_TRACED_SHAPES[key])


_TRACED_SHAPES: dict[str, dict[str, tuple[int, ...]]] = {}


def _trace_hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    _, state = nnx.split(nnx.eval_shape(lambda: build_model(config, seed=0)))
    shapes = {key: variable.shape for key, variable in nnx.to_flat_state(state)}
    result = {}
    for name, (path, transpose) in tensor_names(config).items():
        shape = shapes[path]
        result[name] = (*shape[:-2], shape[-1], shape[-2]) if transpose else shape
    return result
