"""`build_engine`: the one place an `EngineKind` becomes a rollout engine (the enum is the
registry).

Both engines satisfy `locoexp.rollout.protocol.Engine`. vLLM is imported only when selected, and
its absence is reported at start-up with the install command for the platform.
"""

from collections.abc import Sequence

import jax

from locoexp.model.transformer import Transformer
from locoexp.rollout.config import EngineKind, RolloutConfig
from locoexp.rollout.engine import JaxEngine
from locoexp.rollout.protocol import Engine


def build_engine(
    model: Transformer,
    config: RolloutConfig,
    *,
    eos_id: int,
    pad_id: int,
    devices: Sequence[jax.Device],
    max_sequence_tokens: int,
) -> Engine:
    """The host's rollout engine, started from `model`'s current weights.

    `devices` are the engine's devices (the JAX engine spans them, rollout.tensor_parallel per
    replica; vLLM takes its platform from them). `max_sequence_tokens` is the longest prompt
    plus completion the run admits (dataset.max_prompt_tokens + dataset.max_new_tokens); vLLM
    sizes its KV cache by it.
    """
    match config.engine:
        case EngineKind.jax:
            return JaxEngine(model, config, eos_id=eos_id, pad_id=pad_id, devices=devices)
        case EngineKind.vllm:
            from locoexp.rollout import vllm_engine

            platform = vllm_engine.platform_of(devices)
            vllm_engine.require_vllm(platform)
            vllm_engine.default_env(platform)
            return vllm_engine.VllmEngine(
                model,
                config,
                eos_id=eos_id,
                pad_id=pad_id,
                devices=devices,
                max_model_tokens=max_sequence_tokens,
            )
