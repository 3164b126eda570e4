"""LoRA factors <-> a PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`).

What `peft.PeftModel.from_pretrained(<the Hugging Face base>, <directory>)` loads: PEFT stores
`lora_A.weight` [r, D_in] and `lora_B.weight` [D_out, r] (torch Linear layout) under the base
tensor's name prefixed by `base_model.model.`; ours are A [D_in, r] and B [r, D_out]. Reading
is the inverse, so an adapter trained elsewhere can be checked against (or loaded into) ours.
It writes files only; gathering shards and deciding when to export is the caller's.
"""

import json
import pathlib

import numpy as np
from safetensors.numpy import load_file, save_file

from locoexp.adapter.config import AdapterConfig
from locoexp.model.checkpoint import tensor_names
from locoexp.model.config import ModelConfig

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."

Factors = dict[tuple, tuple[np.ndarray, np.ndarray]]  # plain kernel path -> (A, B)


def peft_config(adapter: AdapterConfig, *, base_model: str | None) -> dict:
    """adapter_config.json: the LoRA settings in PEFT's `LoraConfig` keys."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": adapter.rank,
        "lora_alpha": adapter.alpha,
        "lora_dropout": adapter.dropout,
        "target_modules": sorted(t.value for t in adapter.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "inference_mode": True,
    }


def _kernel_names(model: ModelConfig) -> dict[tuple, str]:
    """Plain kernel path -> its Hugging Face module name (no `.weight`)."""
    return {
        path: name.removesuffix(".weight")
        for name, (path, _) in tensor_names(model).items()
        if path[-1] == "kernel"
    }


def write_peft_adapter(
    factors: Factors, adapter: AdapterConfig, model: ModelConfig, directory: str | pathlib.Path
) -> pathlib.Path:
    """Write `factors` (host arrays) as a PEFT adapter directory; returns it."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names, tensors = _kernel_names(model), {}
    for path, (a, b) in factors.items():
        stem = _PREFIX + names[path]
        tensors[f"{stem}.lora_A.weight"] = np.ascontiguousarray(np.asarray(a).T)
        tensors[f"{stem}.lora_B.weight"] = np.ascontiguousarray(np.asarray(b).T)
    save_file(tensors, str(directory / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
    config = peft_config(adapter, base_model=model.checkpoint)
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
