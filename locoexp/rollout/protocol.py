"""`Engine`: what every rollout engine offers the step (the built-in `JaxEngine`, `VllmEngine`).

Placement code holds an `Engine`, never a concrete class: it generates completions, receives
published weights and names the devices publication gathers onto. This module owns the
interface only; it imports no engine.
"""

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

from locoexp.rollout.config import SamplingParams
from locoexp.rollout.engine import Rollout


@runtime_checkable
class Engine(Protocol):
    """A rollout engine over some of this process's devices."""

    params: Any  # what publication blocks on (`jax.block_until_ready(engine.params)`)
    dtype: np.dtype  # the dtype weights are published in (rollout.param_dtype)

    @property
    def devices(self) -> list[jax.Device]:
        """The JAX devices publication gathers the weights onto."""
        ...

    @property
    def num_devices(self) -> int: ...

    def generate(
        self,
        prompts: Sequence[np.ndarray],
        *,
        key: jax.Array,
        max_new_tokens: int,
        sampling: SamplingParams,
        request_caps: Sequence[int] | None = None,
    ) -> Rollout:
        """Complete every prompt with up to `max_new_tokens` tokens (or `request_caps[n]` for
        request n), rows in request order."""
        ...

    def load_weights(self, params: Any) -> None:
        """Publish an nnx.State of the model's Params in one call (O4)."""
        ...

    def load_weights_per_layer(self, params: Any) -> None:
        """Publish layer by layer (the `opt=base` path)."""
        ...
