"""The built-in JAX rollout engine: C decode slots, chunked prefill, a compiled decode loop.

`generate` left-pads every prompt to one bucket and runs the slot programs of
locoexp/rollout/decode.py over C = `wave_rows(N, capacity, r)` slots as `rollout.scheduler` says
(locoexp/rollout/scheduling.py): static waves of C requests, each decoded until its longest row
ends, or continuous batching, where a finished row's slot takes the next waiting request on
device and the last rows are compacted into narrower programs. Programs are compiled ahead of
their first timed call, so `Rollout.prefill_s` and `Rollout.decode_s` hold device time only,
compiles excluded.
 The engine spans the devices it is given (one host's local devices under `co`, the single
controller's devices otherwise): n / (EP x TP) data-parallel replicas of `rollout.expert_parallel` x
`rollout.tensor_parallel` devices each (layouts in locoexp/rollout/sharding.py; EP only for a
mixture-of-experts model). It runs in `rollout.param_dtype` (default the model's); `load_weights`
casts published weights into it. It never trains and never knows about other hosts.

Memory per device, for the planner (a = bytes per element of the engine dtype; n devices, TP t,
r = n / t replicas; N requests; H/K query/KV heads, h head_dim, D width, F MLP width, V
vocabulary, L layers):
- weights: embedding V*D (and the untied head V*D), split by vocabulary over the t devices
  when t divides V, else replicated, and norms (2D per layer + D, +2h per layer with
  qk_norm); per layer q and o D*H*h/t each, k and v D*K*h/t each when t <= K and D*K*h each
  (replicated) when t > K, MLP 3*D*F/t; all times a.
- per wave: C = `wave_rows(N, capacity, r)` rows (at most the capacity, in whole replicas;
  waves = ceil(N / C)), s = C / r rows per device; S = P' + M slots, P' =
  `padded_prompt_tokens` (the power-of-two bucket, at least rollout.prompt_bucket_tokens,
  rounded up to whole prefill chunks above one chunk).
  KV cache: s * S * L * 2 * ceil(K/t) * h * a (t > K: one repeated KV head per device);
  outputs: s * M * (4 + 4) bytes (tokens, log-probs) per wave; continuous batching keeps
  every request's, N * M * (4 + 4), replicated, and the left-padded prompts, N * P' * 4; a
  compaction briefly holds the narrower width's copy of the cache beside it.
- prefill temporaries, one layer at a time, c = min(rollout.prefill_chunk_tokens, P'):
  scores s * (H/t) * c * P' * 4 (float32) and their probabilities at a, plus the [s, c, P']
  mask, and the prompt's P'-slot cache (widened to S slots after); decode's are over S with
  c = 1, plus the logits and sampler buffers, about 3 * s * V * 4 (V / t when split by
  vocabulary).
- `load_weights` with a dtype cast briefly holds the published weights at the engine's layout
  in their own dtype as well.

Shapes: N requests, C slots (rows per wave), P padded prompt length, M = max_new_tokens,
S = P + M cache slots.
"""

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as PS

from locoexp.errors import require
from locoexp.model.transformer import Transformer
from locoexp.rollout import scheduling, sharding
from locoexp.rollout.config import KVCacheKind, RolloutConfig, SamplingParams
from locoexp.rollout.paged_slots import PageLayout
from locoexp.rollout.pages import pages_for


@dataclasses.dataclass(frozen=True)
class Rollout:
    """What generation returns, as host numpy arrays. Rows follow the request order."""

    tokens: np.ndarray  # [N, M] int32, pad after the end of each completion (EOS included)
    logprobs: np.ndarray  # [N, M] float32, behaviour log-probs of the sampled tokens, 0 past end
    lengths: np.ndarray  # [N] int32, generated tokens including EOS
    truncated: np.ndarray  # [N] bool, hit the cap without EOS
    # summed over waves; the first token comes from prefill, a refilled request's from the
    # next decode iteration (continuous batching)
    decode_iterations: int
    waves: int
    # Seconds of prefill and of decode iterations, summed over waves, compiles excluded; None
    # where an engine interleaves the two (vLLM's scheduler). Under continuous batching the
    # JAX engine's refill prefills run inside its decode loop: decode_s includes them.
    prefill_s: float | None = None
    decode_s: float | None = None
    # JAX engine: live rows over computed rows, summed over decode iterations (1 = no decode
    # iteration computed a finished or empty row); requests prefilled into a freed slot.
    slot_occupancy: float | None = None
    refills: int | None = None

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
        abstract: bool = False,
    ):
        """abstract: the weights stay ShapeDtypeStructs on the engine's layout (`model` may come
        from `nnx.eval_shape`), so its programs compile for `devices` without allocating, a TPU
        topology's included (locoexp/compiled)."""
        tp = config.tensor_parallel
        sharding.check_tensor_parallel(model.config, tp, len(devices))
        ep = sharding.resolve_expert_parallel(
            model.config, config.expert_parallel, len(devices) // tp
        )
        sharding.check_expert_parallel(
            model.config, "rollout.expert_parallel", ep, len(devices) // tp
        )
        self.config, self.eos_id, self.pad_id = config, eos_id, pad_id
        self.dtype = jnp.dtype((config.param_dtype or model.config.param_dtype).value)
        self.model_config = dataclasses.replace(  # computes in its weights' dtype
            model.config,
            param_dtype=config.param_dtype or model.config.param_dtype,
            compute_dtype=None,
        )
        self.graphdef, shapes = nnx.split(
            nnx.eval_shape(lambda: Transformer(self.model_config, rngs=nnx.Rngs(0))), nnx.Param
        )
        self.mesh = sharding.engine_mesh(devices, tp, ep)
        self._replicated = NamedSharding(self.mesh, PS())
        self._rows = NamedSharding(self.mesh, PS(sharding.DATA))
        self._param_shardings = sharding.param_shardings(shapes, self.mesh, self.model_config, tp)
        self._cache_heads = sharding.cache_heads(self.model_config, tp)
        self._slots = scheduling.SlotPrograms(
            self.graphdef,
            self.mesh,
            layers=self.model_config.num_layers,
            cache_heads=self._cache_heads,
            vocab_shards=sharding.vocab_shards(self.model_config, tp),
            eos_id=eos_id,
            pad_id=pad_id,
            paged=page_layout(config),
            moe=self.model_config.moe,
        )
        self._abstract = shapes  # the params' structure, for a per-layer load after a release
        if abstract:
            self.params = jax.tree.map(
                lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                shapes,
                self._param_shardings,
            )
        else:
            self.params = self._place(nnx.split(model, nnx.Param)[1], self._param_shardings)

    @property
    def num_devices(self) -> int:
        return self.mesh.devices.size

    @property
    def slot_programs(self) -> scheduling.SlotPrograms:
        """The engine's programs by shape (the compile path lowers them abstractly)."""
        return self._slots

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
        request_caps: Sequence[int] | None = None,
    ) -> Rollout:
        """Complete every prompt (token arrays) with up to `max_new_tokens` new tokens (or
        `request_caps[n]` for request n), by `rollout.scheduler` over the engine's slots."""
        n = len(prompts)
        prompt_len = padded_prompt_tokens(max(len(p) for p in prompts), self.config)
        tokens, lens = self._left_pad(prompts, prompt_len)
        caps = np.asarray(
            np.full(n, max_new_tokens) if request_caps is None else request_caps, np.int32
        )
        check_page_pool(
            self.config, max(len(p) + int(c) for p, c in zip(prompts, caps, strict=True))
        )
        requests = scheduling.host_requests(tokens, lens, caps, first=0)
        call = scheduling.Call(
            prompt_len=prompt_len,
            max_new=max_new_tokens,
            chunk=min(self.config.prefill_chunk_tokens, prompt_len),
            sampling=sampling,
        )
        out = scheduling.generate_slots(
            self._slots,
            self.params,
            requests,
            key=key,
            call=call,
            width=wave_rows(n, self.config.capacity, self.replicas),
            scheduler=self.config.scheduler,
        )
        if out.pages_held_at_end:  # the allocator's invariant, read from the final state
            raise RuntimeError(
                f"the paged KV cache ended a generate call with {out.pages_held_at_end} pages "
                "still held after every request ended: its allocator lost them (a bug)"
            )
        lengths = out.lengths
        ended_with_eos = out.tokens[np.arange(n), np.maximum(lengths - 1, 0)] == self.eos_id
        return Rollout(
            tokens=out.tokens,
            logprobs=out.logprobs,
            lengths=lengths,
            truncated=(lengths >= requests.caps) & (~ended_with_eos | sampling.ignore_eos),
            decode_iterations=out.decode_iterations,
            waves=out.waves,
            prefill_s=out.prefill_s,
            decode_s=out.decode_s,
            slot_occupancy=out.live_slot_iterations / max(out.slot_iterations, 1),
            refills=out.refills,
        )

    def wave_programs(self, prompts: Sequence[np.ndarray], *, max_new_tokens: int, sampling):
        """One static wave of `prompts` as `generate` runs it: jitted `start(params, requests,
        key) -> slots` and `run(params, slots, requests)`, and the requests (for tests, the
        planner's XLA check and profiles)."""
        prompt_len = padded_prompt_tokens(max(len(p) for p in prompts), self.config)
        tokens, lens = self._left_pad(prompts, prompt_len)
        caps = np.full(len(prompts), max_new_tokens, np.int32)
        requests = scheduling.host_requests(tokens, lens, caps, first=0)
        chunk = min(self.config.prefill_chunk_tokens, prompt_len)
        call = scheduling.Call(prompt_len, max_new_tokens, chunk, sampling)
        static = (call, len(prompts), len(prompts))
        start = self._slots.jit("start", static)
        return start, self._slots.jit("run", (*static, 0, False)), requests

    def _left_pad(
        self, prompts: Sequence[np.ndarray], length: int
    ) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.full((len(prompts), length), self.pad_id, np.int32)
        lens = np.zeros(len(prompts), np.int32)
        for i, p in enumerate(prompts):
            tokens[i, length - len(p) :] = p
            lens[i] = len(p)
        return tokens, lens


def page_layout(config: RolloutConfig) -> PageLayout | None:
    """The slots' page layout under `rollout.kv_cache=paged`, None for the dense cache."""
    if config.kv_cache is KVCacheKind.dense:
        return None
    return PageLayout(config.page_tokens, config.kv_cache_pages_per_replica)


def check_page_pool(config: RolloutConfig, row_tokens: int) -> None:
    """Refuse a pool that cannot hold the call's longest row (prompt + its cap, `row_tokens`):
    that row could never finish (the run's caps are checked at start-up, `Config`)."""
    pages = config.kv_cache_pages_per_replica
    if config.kv_cache is KVCacheKind.dense or pages is None:
        return
    need = pages_for(row_tokens, config.page_tokens)
    require(
        need <= pages,
        f"rollout.kv_cache_pages_per_replica={pages} cannot hold one row at its caps (a "
        f"{row_tokens}-token prompt and completion needs {need} pages of rollout.page_tokens="
        f"{config.page_tokens}): set it to at least {need}, or null for every slot at its caps.",
    )


@functools.cache
def _caster(dtype):
    """A program casting every leaf to `dtype`, in place of its (donated) input."""
    return jax.jit(lambda tree: jax.tree.map(lambda x: x.astype(dtype), tree), donate_argnums=0)
