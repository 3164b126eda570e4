"""LoRA factors <-> a PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`).

What `peft.PeftModel.from_pretrained(<the Hugging Face base>, <directory>)` loads: PEFT stores
`lora_A.weight` [r, D_in] and `lora_B.weight` [D_out, r] (torch Linear layout) under the base
tensor's name prefixed by `base_model.model.`; ours are A [D_in, r] and B [r, D_out]. The base
weights trained in full (`adapter.modules_to_save`) are stored whole under their own names, as
PEFT saves its `modules_to_save`; a head tied to a saved embedding is marked
`ensure_weight_tying`, so PEFT's head uses the trained embedding as ours does. Reading is the
inverse, so an adapter trained elsewhere can be checked against (or loaded into) ours.
It writes files only; gathering shards and deciding when to export is the caller's.
"""

import json
import pathlib

import numpy as np
from safetensors.numpy import load_file, save_file

from locoexp.adapter.config import AdapterConfig, SavedModule, adapted_targets
from locoexp.model.checkpoint import tensor_names
from locoexp.model.config import ModelConfig

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."

Factors = dict[tuple, tuple[np.ndarray, np.ndarray]]  # plain kernel path -> (A, B)
Saved = dict[tuple, np.ndarray]  # plain parameter path -> a `modules_to_save` weight
_EMBEDDING = ("embed", "embedding")  # the plain path of `model.embed_tokens.weight`


def peft_config(adapter: AdapterConfig, model: ModelConfig) -> dict:
    """adapter_config.json: the LoRA settings in PEFT's `LoraConfig` keys (the targets named,
    or every projection `model` has when `adapter.targets` is null)."""
    saved = [m.value for m in adapter.modules_to_save]
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": model.checkpoint,
        "r": adapter.rank,
        "lora_alpha": adapter.alpha,
        "lora_dropout": adapter.dropout,
        "target_modules": sorted(t.value for t in adapted_targets(adapter, model)),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "inference_mode": True,
        "modules_to_save": saved or None,
        # a tied head follows the trained embedding in PEFT as it does here
        "ensure_weight_tying": SavedModule.embed_tokens.value in saved,
    }


def _kernel_names(model: ModelConfig) -> dict[tuple, str]:
    """Plain kernel path -> its Hugging Face module name (no `.weight`)."""
    return {
        path: name.removesuffix(".weight")
        for name, (path, _) in tensor_names(model).items()
        if path[-1] == "kernel"
    }


def _saved_names(model: ModelConfig) -> dict[tuple, tuple[str, bool]]:
    """Plain parameter path -> (its name in a PEFT file, whether stored transposed)."""
    return {path: (_PREFIX + name, t) for name, (path, t) in tensor_names(model).items()}


def write_peft_adapter(
    factors: Factors,
    adapter: AdapterConfig,
    model: ModelConfig,
    directory: str | pathlib.Path,
    *,
    saved: Saved | None = None,
) -> pathlib.Path:
    """Write `factors` and the `saved` modules' weights (host arrays) as a PEFT adapter
    directory; returns it."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names, tensors = _kernel_names(model), {}
    for path, (a, b) in factors.items():
        stem = _PREFIX + names[path]
        tensors[f"{stem}.lora_A.weight"] = np.ascontiguousarray(np.asarray(a).T)
        tensors[f"{stem}.lora_B.weight"] = np.ascontiguousarray(np.asarray(b).T)
    saved_names = _saved_names(model)
    for path, weight in (saved or {}).items():
        name, transposed = saved_names[path]
        tensors[name] = np.ascontiguousarray(np.asarray(weight).T if transposed else weight)
        if model.tie_embeddings and path == _EMBEDDING:  # PEFT saves the tied head's copy too
            tensors[_PREFIX + "lm_head.weight"] = tensors[name]
    save_file(tensors, str(directory / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
    config = peft_config(adapter, model)
    (directory / ADAPTER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return directory


def read_peft_adapter(directory: str | pathlib.Path, model: ModelConfig) -> Factors:
    """The (A, B) factors of a PEFT adapter directory, keyed by plain kernel path."""
    tensors = load_file(str(pathlib.Path(directory) / ADAPTER_WEIGHTS_FILE))
    factors = {}
    for path, name in _kernel_names(model).items():
        stem = _PREFIX + name
        if f"{stem}.lora_A.weight" in tensors:
            a, b = tensors[f"{stem}.lora_A.weight"], tensors[f"{stem}.lora_B.weight"]
            factors[path] = (a.T.copy(), b.T.copy())
    return factors


def read_saved_modules(directory: str | pathlib.Path, model: ModelConfig) -> Saved:
    """The `modules_to_save` weights of a PEFT adapter directory, keyed by plain path."""
    tensors = load_file(str(pathlib.Path(directory) / ADAPTER_WEIGHTS_FILE))
    return {
        path: tensors[name].T.copy() if transposed else tensors[name]
        for path, (name, transposed) in _saved_names(model).items()
        if name in tensors
    }
