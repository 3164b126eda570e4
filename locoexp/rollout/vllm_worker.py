"""The vLLM worker extension that publishes locoexp weights into a running engine.

vLLM mixes `worker_extension_cls` into each of its workers, so `LLM.collective_rpc(name, ...)`
can call the methods below on every worker (every TP rank) of the engine: vLLM's documented path
for RL weight updates (examples/offline_inference/rlhf*.py). This module runs inside vLLM's
worker and imports torch; the JAX side never imports it (vLLM imports it by its dotted name).
It must not start anything of its own.
"""

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np


class WeightUpdateExtension:
    """Mixed into vLLM's worker: `self.model_runner.model` is the engine's torch model."""

    if TYPE_CHECKING:  # what the vLLM worker this is mixed into provides
        model_runner: Any

        def reload_weights(self, **kwargs: Any) -> None: ...

    def load_locoexp_weights(self, weights: list[tuple[str, np.ndarray]]) -> int:
        """Copy Hugging Face-named host arrays into the model in place; returns tensors sent.

        vLLM's in-place reload (`Worker.reload_weights`, checkpoint format) runs the model's own
        `load_weights` (q/k/v into qkv_proj, gate/up into gate_up_proj, TP slicing, the dtype
        cast) and then the same post-load processing as at engine start (e.g. vLLM-CPU repacks
        linear weights for oneDNN, after which plain `model.load_weights` no longer applies).
        Layers absent from `weights` keep their current tensors.
        """
        import torch

        with warnings.catch_warnings():  # host arrays from jax.device_get are read-only
            warnings.simplefilter("ignore", UserWarning)
            tensors = [(name, torch.from_numpy(array)) for name, array in weights]
        self.reload_weights(weights_iterator=tensors, is_checkpoint_format=True)
        self._refresh_tied_head()
        return len(tensors)

    def _refresh_tied_head(self) -> None:
        """Redo the output head's post-load step when it shares the embedding.

        A tied head receives no tensor of its own, so the reload skips it; but vLLM-CPU keeps a
        prepacked GEMM copy of the head's weight (`cpu_linear`), which would go on computing
        logits with the old embedding. On other platforms this step does nothing.
        """
        model = self.model_runner.model
        head = getattr(model, "lm_head", None)
        if head is None or not self.model_runner.model_config.hf_config.tie_word_embeddings:
            return
        embed = model.model.embed_tokens
        assert head.weight.data_ptr() == embed.weight.data_ptr(), "tied head lost its weight"
        head.quant_method.process_weights_after_loading(head)
