"""`model.checkpoint=<Hub id>` resolves from the local Hugging Face cache only
(`locoexp.model.hub`): a cached snapshot loads with its weights, a missing one and a bad path are
refused with one sentence, and nothing is downloaded (`HF_HUB_OFFLINE=1`)."""

import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from locoexp.errors import ConfigError
from locoexp.model.checkpoint import load_model, save_checkpoint
from locoexp.model.config import ModelConfig
from locoexp.model.transformer import build_model, causal_segment_mask
from locoexp.tokenizer.build import build_tokenizer
from locoexp.tokenizer.qwen3 import Qwen3Tokenizer

TINY = ModelConfig()  # conf/model/tiny.yaml: the embedded default's model


def _logits(model, tokens):
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    hidden, _ = model(tokens, positions, causal_segment_mask(jnp.ones_like(tokens)))
    return np.asarray(model.logits(hidden))


def _hub_cache(root, repo_id: str, source) -> None:
    """The layout huggingface_hub keeps: models--owner--name/{refs/main, snapshots/<rev>/...}."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(source, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hub"


def test_a_cached_hub_id_loads_the_snapshot_weights(offline_cache, tmp_path):
    saved = build_model(TINY, seed=7)  # not the seed load_model would use for a random init
    save_checkpoint(saved, TINY, str(tmp_path / "src"))
    _hub_cache(offline_cache, "locoexp-test/tiny-echo", tmp_path / "src")
    loaded = load_model(ModelConfig(checkpoint="locoexp-test/tiny-echo"), seed=0)
    tokens = jnp.arange(8).reshape(1, 8)
    np.testing.assert_array_equal(_logits(loaded, tokens), _logits(saved, tokens))


def test_a_missing_hub_id_and_a_missing_directory_are_refused(offline_cache, tmp_path):
    with pytest.raises(ConfigError, match=r"Qwen/Qwen3-0\.6B is neither a local directory nor in"):
        load_model(ModelConfig(checkpoint="Qwen/Qwen3-0.6B"), seed=0)
    with pytest.raises(ConfigError, match="is not a directory"):
        load_model(ModelConfig(checkpoint=str(tmp_path / "missing" / "dir")), seed=0)


def test_a_cached_snapshot_without_tokenizer_files_uses_the_builtin_tokenizer(
    offline_cache, tmp_path
):
    save_checkpoint(build_model(TINY, seed=0), TINY, str(tmp_path / "src"))
    _hub_cache(offline_cache, "locoexp-test/no-tokenizer", tmp_path / "src")
    assert isinstance(build_tokenizer("locoexp-test/no-tokenizer"), Qwen3Tokenizer)
