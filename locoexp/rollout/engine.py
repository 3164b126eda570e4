"""The built-in JAX rollout engine: waves of chunked prefill and a compiled decode loop.

`generate` splits the requests into waves of at most `rollout.capacity` sequences (0 = all in
one wave), left-pads each wave's prompts to one bucket and runs two compiled programs per wave
(locoexp/rollout/decode.py): chunked prefill into a KV cache sized for that wave, then the
decode loop. Programs are compiled ahead of their first timed call, so `Rollout.prefill_s` and
`Rollout.decode_s` hold device time only, compiles excluded.

The engine spans the devices it is given (one host's local devices under `co`, the single
controller's devices otherwise): n / TP data-parallel replicas of `rollout.tensor_parallel`
devices each (layouts in locoexp/rollout/sharding.py). It runs in `rollout.param_dtype` (default
the model's); `load_weights` casts published weights into it. It never trains and never knows
about other hosts.

Memory per device, for the planner (a = bytes per element of the engine dtype; n devices, TP t,
r = n / t replicas; N requests; H/K query/KV heads, h head_dim, D width, F MLP width, V
vocabulary, L layers):
- weights: replicated embedding V*D (and the untied head V*D) and norms (2D per layer + D, +2h
  per layer with qk_norm); per layer q and o D*H*h/t each, k and v D*K*h/t each when t <= K and
  D*K*h each (replicated) when t > K, MLP 3*D*F/t; all times a.
- per wave: C = `wave_rows(N, capacity, r)` rows (at most the capacity, in whole replicas;
  waves = ceil(N / C)), s = C / r rows per device; S = P' + M slots, P' =
  `padded_prompt_tokens` (the power-of-two bucket, at least rollout.prompt_bucket_tokens,
  rounded up to whole prefill chunks above one chunk).
  KV cache: s * S * L * 2 * ceil(K/t) * h * a (t > K: one repeated KV head per device);
  decode state: s * M * (4 + 4) bytes (tokens, log-probs).
- prefill temporaries, one layer at a time, c = min(rollout.prefill_chunk_tokens, P'):
  scores s * (H/t) * c * S * 4 (float32) and their probabilities at a, plus the [s, c, S] mask;
  decode's are the same with c = 1, plus the logits and sampler buffers, about 3 * s * V * 4.
- `load_weights` with a dtype cast briefly holds the published weights at the engine's layout
  in their own dtype as well.

Shapes: N requests, C rows per wave, P padded prompt length, M = max_new_tokens, S = P + M slots.
"""

import dataclasses
import functools
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as PS

from locoexp.model.transformer import Transformer
from locoexp.rollout import decode as programs
from locoexp.rollout import sharding
from locoexp.rollout.config import RolloutConfig, SamplingParams


@dataclasses.dataclass(frozen=True)
class Rollout:
    """What generation returns, as host numpy arrays. Rows follow the request order."""

    tokens: np.ndarray  # [N, M] int32, pad after the end of each completion (EOS included)
    logprobs: np.ndarray  # [N, M] float32, behaviour log-probs of the sampled tokens, 0 past end
    lengths: np.ndarray  # [N] int32, generated tokens including EOS
    truncated: np.ndarray  # [N] bool, hit the cap without EOS
    decode_iterations: int  # summed over waves (the first token comes from prefill)
    waves: int
    # Seconds of prefill and of decode iterations, summed over waves, compiles excluded; None
    # where an engine interleaves the two (vLLM's scheduler).
    prefill_s: float | None = None
    decode_s: float | None = None

    def completion(self, n: int) -> np.ndarray:
        return self.tokens[n, : self.lengths[n]]

    @property
    def decode_s_per_iteration(self) -> float | None:
        """Figure 7b's per-iteration decode time: decode iterations only, prefill excluded."""
        if self.decode_s is None or self.decode_iterations == 0:
            return None
        return self.decode_s / self.decode_iterations


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def prompt_bucket(length: int, smallest: int) -> int:
    """Padded prompt length: the next power of two, at least `smallest`. Each bucket compiles
    one program; GSM8K's 39-239-token prompts need 3 buckets instead of 13 multiples of 16,
    which kept recompiling generation for the first steps of a run (experiments/LOG.md)."""
    return max(smallest, 1 << max(0, (length - 1).bit_length()))


def padded_prompt_tokens(longest: int, config: RolloutConfig) -> int:
    """The engine's padded prompt length P for a wave whose longest prompt has `longest` tokens:
    the bucket, rounded up to whole prefill chunks when it exceeds one chunk."""
    bucket = prompt_bucket(longest, config.prompt_bucket_tokens)
    chunk = config.prefill_chunk_tokens
    return bucket if bucket <= chunk else _round_up(bucket, chunk)


def wave_rows(requests: int, capacity: int, replicas: int) -> int:
    """Rows per wave: every request (capacity 0) or at most `capacity`, in whole replicas:
    rounded up over the requests (the last rows repeat a prompt), down to stay within the
    capacity, and at least one row per replica."""
    rows = _round_up(min(capacity or requests, requests), replicas)
    if capacity and rows > capacity:
        rows = max(replicas, capacity // replicas * replicas)
    return rows


class JaxEngine:
    """Generates completions with the current weights; `load_weights` publishes new ones."""

    def __init__(
        self,
        model: Transformer,
        config: RolloutConfig,
        *,
        eos_id: int,
        pad_id: int,
        devices: Sequence[jax.Device],
    ):
        tp = config.tensor_parallel
        sharding.check_tensor_parallel(model.config, tp, len(devices))
        self.config, self.eos_id, self.pad_id = config, eos_id, pad_id
        self.dtype = jnp.dtype((config.param_dtype or model.config.param_dtype).value)
        self.model_config = dataclasses.replace(
            model.config, param_dtype=config.param_dtype or model.config.param_dtype
        )
        self.graphdef, abstract = nnx.split(
            nnx.eval_shape(lambda: Transformer(self.model_config, rngs=nnx.Rngs(0))), nnx.Param
        )
        self.mesh = sharding.engine_mesh(devices, tp)
        self._replicated = NamedSharding(self.mesh, PS())
        self._rows = NamedSharding(self.mesh, PS(sharding.DATA))
        self._param_shardings = sharding.param_shardings(abstract, self.mesh, self.model_config, tp)
        self._cache_heads = sharding.cache_heads(self.model_config, tp)
        self._programs = {}
        self._abstract = abstract  # the params' structure, for a per-layer load after a release
        self.params = self._place(nnx.split(model, nnx.Param)[1], self._param_shardings)

    @property
    def num_devices(self) -> int:
        return self.mesh.devices.size

    @property
    def replicas(self) -> int:
        """Data-parallel replicas: the engine's devices / rollout.tensor_parallel."""
        return self.mesh.shape[sharding.DATA]

    @property
    def devices(self) -> list[jax.Device]:
        return list(self.mesh.devices.flat)

    def load_weights(self, params) -> None:
        """Publish `params` (an nnx.State of the model's Params) to the engine in one call (O4).

        The engine keeps its own copy (`may_alias=False`): the trainer donates its buffers to
        the next step, which must not delete the weights the engine samples with."""
        self.params = self._place(params, self._param_shardings)

    @property
    def holds_weights(self) -> bool:
        return self.params is not None

    def release_weights(self) -> None:
        """Free the engine's weight copy until the next load (rollout.release_weights_during_
        training; Table H2's 405B TP16 workaround). The copy is the engine's own (`_place`
        never aliases), so deleting its buffers frees them even if a stray reference remains."""
        if self.params is None:
            return
        for leaf in jax.tree.leaves(self.params):
            leaf.delete()
        self.params = None

    def load_weights_per_layer(self, params) -> None:
        """Publish layer by layer, one transfer per top-level subtree (the `opt=base` path)."""
        pure, shardings = nnx.to_pure_dict(params), nnx.to_pure_dict(self._param_shardings)
        merged = {}
        for name, subtree in pure.items():
            if name == "layers":
                merged[name] = {
                    i: self._place(layer, shardings[name][i]) for i, layer in subtree.items()
                }
            else:
                merged[name] = self._place(subtree, shardings[name])
        if self.params is None:  # released: fill a fresh tree of the params' structure
            self.params = jax.tree.map(lambda x: x, self._abstract)
        nnx.replace_by_pure_dict(self.params, merged)

    def _place(self, params, shardings):
        """Copy `params` onto the engine's layout, cast into its dtype (Table I3's bf16 sampler
        of an fp32 trainer) by a program that reuses the copy's buffers."""
        placed = jax.device_put(params, shardings, may_alias=False)
        if all(x.dtype == self.dtype for x in jax.tree.leaves(placed)):
            return placed
        return _caster(self.dtype)(placed)

    def generate(
        self,
        prompts: Sequence[np.ndarray],
        *,
        key: jax.Array,
        max_new_tokens: int,
        sampling: SamplingParams,
    ) -> Rollout:
        """Complete every prompt (token arrays) with up to `max_new_tokens` new tokens."""
        n = len(prompts)
        rows = wave_rows(n, self.config.capacity, self.replicas)
        prompt_len = padded_prompt_tokens(max(len(p) for p in prompts), self.config)
        outputs, clock = [], {"prefill": 0.0, "decode": 0.0}
        for start in range(0, n, rows):
            batch = list(prompts[start : start + rows])
            batch += [batch[0]] * (rows - len(batch))  # pad the last wave with a real prompt
            key, wave_key = jax.random.split(key)
            outputs.append(self._wave(batch, prompt_len, max_new_tokens, sampling, wave_key, clock))
        cat = lambda i: np.concatenate([o[i] for o in outputs])[:n]
        tokens, logprobs, lengths = cat(0), cat(1), cat(2)
        ended_with_eos = tokens[np.arange(n), np.maximum(lengths - 1, 0)] == self.eos_id
        return Rollout(
            tokens=tokens,
            logprobs=logprobs,
            lengths=lengths,
            truncated=(lengths >= max_new_tokens) & (~ended_with_eos | sampling.ignore_eos),
            decode_iterations=int(sum(int(o[3]) for o in outputs)),
            waves=len(outputs),
            prefill_s=clock["prefill"],
            decode_s=clock["decode"],
        )

    def _wave(self, batch, prompt_len, max_new, sampling, key, clock: dict) -> tuple:
        """One wave: prefill, then decode, each compiled before its clock starts."""
        tokens, lens = self._left_pad(batch, prompt_len)
        tokens, lens = jax.device_put(tokens, self._rows), jax.device_put(lens, self._rows)
        signature = (len(batch), prompt_len, max_new, sampling)
        prefill = self._compiled("prefill", signature, self.params, tokens, lens, key)
        start = time.perf_counter()
        state = jax.block_until_ready(prefill(self.params, tokens, lens, key))
        clock["prefill"] += time.perf_counter() - start
        decode = self._compiled("decode", signature, self.params, state, lens)
        start = time.perf_counter()
        final = jax.block_until_ready(decode(self.params, state, lens))
        clock["decode"] += time.perf_counter() - start
        return jax.device_get((final.tokens, final.logprobs, final.lengths, final.step - 1))

    def _left_pad(
        self, prompts: Sequence[np.ndarray], length: int
    ) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.full((len(prompts), length), self.pad_id, np.int32)
        lens = np.zeros(len(prompts), np.int32)
        for i, p in enumerate(prompts):
            tokens[i, length - len(p) :] = p
            lens[i] = len(p)
        return tokens, lens

    def _compiled(self, kind: str, signature: tuple, *args):
        """The compiled prefill or decode program of `signature`, compiled on first use."""
        if (kind, signature) not in self._programs:
            self._programs[kind, signature] = self._jit(kind, signature).lower(*args).compile()
        return self._programs[kind, signature]

    def _jit(self, kind: str, signature: tuple):
        rows, prompt_len, max_new, sampling = signature
        common = dict(sampling=sampling, eos_id=self.eos_id, pad_id=self.pad_id)
        cache = sharding.cache_sharding(self.mesh)
        state = programs.DecodeState(
            step=self._replicated,
            cache=tuple((cache, cache) for _ in range(self.model_config.num_layers)),
            tokens=self._rows,
            logprobs=self._rows,
            done=self._rows,
            lengths=self._rows,
            key=self._replicated,
        )
        if kind == "decode":  # the state is donated: the loop updates its cache in place
            fn = functools.partial(programs.decode, self.graphdef, **common)
            return jax.jit(fn, out_shardings=state, donate_argnums=(1,))
        chunk = min(self.config.prefill_chunk_tokens, prompt_len)
        fn = functools.partial(
            programs.prefill,
            self.graphdef,
            chunk=chunk,
            max_new=max_new,
            cache_heads=self._cache_heads,
            **common,
        )
        return jax.jit(fn, out_shardings=state)


@functools.cache
def _caster(dtype):
    """A program casting every leaf to `dtype`, in place of its (donated) input."""
    return jax.jit(lambda tree: jax.tree.map(lambda x: x.astype(dtype), tree), donate_argnums=0)
