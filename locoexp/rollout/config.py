"""Schema of the `rollout` config group: which engine generates, how, and how many at once."""

import dataclasses
import enum

from locoexp.errors import require


class EngineKind(enum.Enum):
    jax = "jax"  # built in: compiled prefill + decode loop with a KV cache
    vllm = "vllm"  # vLLM / tpu-inference where installed


@dataclasses.dataclass(kw_only=True)
class RolloutConfig:
    engine: EngineKind = EngineKind.jax
    temperature: float = 1.0
    top_k: int = 0  # 0 = off (no top-k mask is computed, as the paper's sampler)
    top_p: float = 1.0  # 1.0 = off
    # Paper's scale study: every completion runs to max_new_tokens, EOS is not a stop.
    ignore_eos: bool = False
    # Max concurrent sequences per engine; larger batches generate in waves (Appendix E: "two
    # waves at 8 chips"). 0 = all requests of the host in one wave.
    capacity: int = 0
    tensor_parallel: int = 1  # TP degree per engine replica (Section 4.1: TP1 for small models)
    # Prompt lengths are padded up to a multiple of this, so a run compiles few shapes.
    prompt_bucket_tokens: int = 16
    eval_temperature: float = 0.7  # held-out evaluation sampling (Table I3: T 0.7)

    def __post_init__(self):
        require(self.temperature >= 0, f"rollout.temperature={self.temperature} must be >= 0 (0 = greedy).")
        require(self.top_k >= 0, f"rollout.top_k={self.top_k} must be >= 0 (0 = off).")
        require(0 < self.top_p <= 1, f"rollout.top_p={self.top_p} must be in (0, 1].")
        require(self.capacity >= 0, f"rollout.capacity={self.capacity} must be >= 0 (0 = one wave).")
        require(self.tensor_parallel >= 1, f"rollout.tensor_parallel={self.tensor_parallel} must be >= 1.")
        require(self.prompt_bucket_tokens >= 1,
                f"rollout.prompt_bucket_tokens={self.prompt_bucket_tokens} must be >= 1.")
        require(self.eval_temperature >= 0, f"rollout.eval_temperature={self.eval_temperature} must be >= 0.")
