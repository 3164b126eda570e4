"""The trained policy out of a run: a Hugging Face checkpoint directory.

`export_policy` writes `config.json`, `model.safetensors` (sharded with an index when large) and
the run's tokenizer files, which `transformers.AutoModelForCausalLM.from_pretrained`, vLLM and
`model.checkpoint=<dir>` all load. Parameters are gathered from every process's shards (all
processes call it); process 0 writes into a temporary directory and renames it into place, so a
directory that exists is complete.

Where exports go in a run directory: `policy/final` after the last step and
`policy/update_<n>` for each scored checkpoint of `eval_at_updates` (the paper's Table I3 scores
the policy after n updates). Under `adapter=lora` the directory holds the merged policy and, in
`adapter/`, the PEFT adapter (`peft.PeftModel.from_pretrained(<base>, <dir>/adapter)`). This
module must not decide when to export.
"""

import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from safetensors import SafetensorError

from locoexp.adapter.config import AdapterConfig
from locoexp.adapter.lora import lora_factors, saved_weights
from locoexp.adapter.peft import write_peft_adapter
from locoexp.errors import unwritable
from locoexp.model.checkpoint import save_checkpoint
from locoexp.model.config import ModelConfig
from locoexp.tokenizer.files import write_tokenizer_files

POLICY_DIR = "policy"
ADAPTER_DIR = "adapter"  # the PEFT adapter inside a LoRA run's policy directory


def policy_directory(run_dir: str | Path, *, updates: int | None) -> Path:
    """`<run_dir>/policy/final` (updates=None) or `<run_dir>/policy/update_<updates>`."""
    name = "final" if updates is None else f"update_{updates:06d}"
    return Path(run_dir) / POLICY_DIR / name


def gather_to_host(params: Any) -> Any:
    """Every parameter as a full numpy array on every process (a collective when sharded across
    processes; every process must call it)."""
    if all(x.is_fully_addressable for x in jax.tree.leaves(params)):
        return jax.tree.map(np.asarray, params)
    return multihost_utils.process_allgather(params, tiled=True)


def export_trainer_policy(trainer, model: ModelConfig, tokenizer, directory: str | Path):
    """A `Trainer`'s policy (`export_policy`), with its PEFT adapter under `adapter=lora`."""
    adapter = (trainer.adapter, trainer.trainable) if trainer.adapter.trains_adapters else None
    return export_policy(
        trainer.params, trainer.graphdef, model, tokenizer, directory, adapter=adapter
    )


def export_policy(
    params,
    graphdef,
    model: ModelConfig,
    tokenizer,
    directory: str | Path,
    *,
    adapter: tuple[AdapterConfig, object] | None = None,
) -> Path | None:
    """Write the policy `nnx.merge(graphdef, params)` as a Hugging Face directory, and the LoRA
    `adapter` (its config and trained state: the factors and the `modules_to_save` weights)
    as a PEFT directory in `adapter/`; returns the directory on process 0, None elsewhere."""
    host_params = gather_to_host(params)
    host_adapters = None if adapter is None else gather_to_host(adapter[1])
    if jax.process_index() != 0:
        return None
    directory = Path(directory)
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        save_checkpoint(nnx.merge(graphdef, host_params), model, str(partial))
        write_tokenizer_files(tokenizer, partial)
        if adapter is not None and host_adapters is not None:
            trained, config = nnx.to_pure_dict(host_adapters), adapter[0]
            saved = saved_weights(trained, config, model)
            factors = lora_factors(trained)
            write_peft_adapter(factors, config, model, partial / ADAPTER_DIR, saved=saved)
    except (OSError, SafetensorError) as error:  # a full disk: no partial export left behind
        if not isinstance(error, OSError):  # safetensors' own I/O errors only
            if "I/O error: " not in str(error):
                raise
            error = OSError(None, str(error).rpartition("I/O error: ")[2])
        shutil.rmtree(partial, ignore_errors=True)
        kept = (
            "no partial export was left, and the checkpoints before this step's are intact "
            "(resuming from them exports again)"
        )
        raise unwritable(directory, error, kept=kept) from None
    _normal_modes(partial)
    shutil.rmtree(directory, ignore_errors=True)
    partial.rename(directory)
    return directory


def _normal_modes(directory: Path) -> None:
    """Give every exported file the mode a file opened here gets (0644 under the usual umask):
    safetensors writes its files through a private temporary file, mode 0600, which other users
    of a shared machine (a vLLM server, a colleague) could not read."""
    normal = (directory / "config.json").stat().st_mode & 0o777  # written by open()
    for path in directory.rglob("*"):
        if path.is_file():
            path.chmod(normal)
