"""`model.checkpoint` as a local directory or a Hugging Face Hub id resolved from the local cache.

The ecosystem names checkpoints by Hub id (`Qwen/Qwen3-0.6B`). A value that is not an existing
directory and has the form `owner/name` is looked up with `huggingface_hub.snapshot_download(...,
local_files_only=True)`: the snapshot already in the cache (`HF_HUB_CACHE`, or `HF_HOME/hub`, or
`~/.cache/huggingface/hub`). This module never downloads: a run must not depend on the network
(TPU hosts often have none), so a missing snapshot is refused with the command that fetches it.
"""

import os
import re
from pathlib import Path

from locoexp.errors import ConfigError

# The Hub's repo id form: one owner and one name of letters, digits, '-', '_', '.'.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def resolve_checkpoint(value: str) -> Path:
    """The local directory `model.checkpoint=value` names (a directory, or a cached Hub id)."""
    path = Path(value).expanduser()
    if path.is_dir():
        return path
    if not HUB_ID.match(value) or value.startswith((".", "~")):
        raise ConfigError(
            f"model.checkpoint={value} is not a directory: give a local Hugging Face checkpoint "
            "directory (config.json + safetensors), a Hub id such as Qwen/Qwen3-0.6B, or null "
            "for random init."
        )
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE
    try:
        return Path(snapshot_download(value, local_files_only=True, cache_dir=cache))
    except LocalEntryNotFoundError:
        raise ConfigError(
            f"model.checkpoint={value} is neither a local directory nor in the Hugging Face cache "
            f"at {cache}; fetch it first with `hf download {value}` on a machine with network "
            "access (locoexp never downloads), or give a local directory."
        ) from None
