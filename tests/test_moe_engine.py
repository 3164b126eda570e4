"""The JAX engine generates with the new architectures as with the dense one: its behaviour
log-probs equal a full forward's recomputation for a tiny Qwen3-MoE and a tiny Gemma4 MoE
(sliding window shorter than the rows, global layers with their own KV-cache shape)."""

import dataclasses

import jax
import numpy as np
import pytest
from tiny_policy import PAD, TINY, random_prompts, reference_logprobs

from locoexp.model.config import Family
from locoexp.model.transformer import build_model
from locoexp.rollout.config import RolloutConfig, SamplingParams
from locoexp.rollout.engine import JaxEngine

QWEN3_MOE = dataclasses.replace(TINY, num_experts=4, experts_per_token=2, expert_mlp_dim=16)
GEMMA4_MOE = dataclasses.replace(
    QWEN3_MOE, family=Family.gemma4, num_layers=3, sliding_window=4, global_attention_every=3,
    global_head_dim=16, global_kv_heads=1, global_rotary_fraction=0.25, global_key_is_value=True,
    final_logit_softcap=30.0,
)  # fmt: skip
MAX_NEW = 10


@pytest.mark.parametrize("config", [QWEN3_MOE, GEMMA4_MOE], ids=["qwen3_moe", "gemma4_moe"])
@pytest.mark.parametrize("prefill_chunk", [512, 4])
@pytest.mark.slow
def test_engine_logprobs_equal_full_forward_recomputation(config, prefill_chunk):
    model = build_model(config, seed=0)
    engine = JaxEngine(
        model,
        RolloutConfig(prompt_bucket_tokens=1, prefill_chunk_tokens=prefill_chunk),
        eos_id=-1,
        pad_id=PAD,
        devices=jax.local_devices(),
    )
    prompts = random_prompts([3, 9, 5, 7], seed=2)
    rollout = engine.generate(
        prompts, key=jax.random.key(1), max_new_tokens=MAX_NEW,
        sampling=SamplingParams(temperature=1.0),
    )  # fmt: skip
    completions = [rollout.completion(n) for n in range(len(prompts))]
    expected = reference_logprobs(model, prompts, completions, temperature=1.0)
    np.testing.assert_allclose(rollout.logprobs, np.stack(expected), atol=1e-5, rtol=0)
