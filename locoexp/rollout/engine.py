"""The built-in JAX rollout engine: batched prefill, then a compiled decode loop over a KV cache.

One `generate` call is one compiled program per wave: prefill of the left-padded prompts, then a
`lax.while_loop` that decodes one token per row per iteration and stops when every row has hit
EOS or the cap. There is no host round trip per token (the paper's Eq. 2 per-iteration terms are
all device time). Requests above `capacity` are generated in waves of `capacity` rows.

The engine is data-parallel over the devices it is given (one host's local devices under `co`):
rows are sharded over them and the weights replicated (DP x TP1, Section 2). It never trains and
never knows about other hosts; `load_weights` replaces its weights in one call.

Shapes: N requests, C rows per wave, P padded prompt length, M = max_new_tokens, S = P + M slots.
"""

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as PS

from locoexp.model.transformer import Transformer, init_cache
from locoexp.rollout.config import RolloutConfig
from locoexp.rollout.sampling import sample_tokens


@dataclasses.dataclass(frozen=True)
class Rollout:
    """What generation returns, as host numpy arrays. Rows follow the request order."""

    tokens: np.ndarray  # [N, M] int32, pad after the end of each completion (EOS included)
    logprobs: (
        np.ndarray
    )  # [N, M] float32, behaviour log-probs of the sampled tokens, 0 past the end
    lengths: np.ndarray  # [N] int32, generated tokens including EOS
    truncated: np.ndarray  # [N] bool, hit the cap without EOS
    decode_iterations: int  # summed over waves
    waves: int

    def completion(self, n: int) -> np.ndarray:
        return self.tokens[n, : self.lengths[n]]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Static per-call sampling settings (each distinct value compiles once)."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    ignore_eos: bool = False


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def prompt_bucket(length: int, smallest: int) -> int:
    """Padded prompt length: the next power of two, at least `smallest`. Each bucket compiles
    one program; GSM8K's 39-239-token prompts need 3 buckets instead of 13 multiples of 16,
    which kept recompiling generation for the first steps of a run (experiments/LOG.md)."""
    return max(smallest, 1 << max(0, (length - 1).bit_length()))


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
        self.graphdef, params = nnx.split(model, nnx.Param)
        self.model_config = model.config
        self.config = config
        self.eos_id, self.pad_id = eos_id, pad_id
        self.mesh = Mesh(np.array(devices), ("data",))
        self._replicated = NamedSharding(self.mesh, PS())
        self._rows = NamedSharding(self.mesh, PS("data"))
        self.params = jax.device_put(params, self._replicated, may_alias=False)
        self._programs = {}

    @property
    def num_devices(self) -> int:
        return self.mesh.devices.size

    @property
    def devices(self) -> list[jax.Device]:
        return list(self.mesh.devices.flat)

    def load_weights(self, params) -> None:
        """Publish `params` (an nnx.State of the model's Params) to the engine in one call (O4).

        The engine keeps its own replica (`may_alias=False`): the trainer donates its buffers to
        the next step, which must not delete the weights the engine samples with."""
        self.params = jax.device_put(params, self._replicated, may_alias=False)

    def load_weights_per_layer(self, params) -> None:
        """Publish layer by layer, one transfer per top-level subtree (the `opt=base` path)."""
        pure = nnx.to_pure_dict(params)
        merged = {}
        for name, subtree in pure.items():
            if name == "layers":
                merged[name] = {
                    i: jax.device_put(layer, self._replicated, may_alias=False)
                    for i, layer in subtree.items()
                }
            else:
                merged[name] = jax.device_put(subtree, self._replicated, may_alias=False)
        nnx.replace_by_pure_dict(self.params, merged)

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
        capacity = self.config.capacity or n
        rows = _round_up(min(capacity, n), self.num_devices)
        waves = -(-n // rows)
        prompt_len = prompt_bucket(max(len(p) for p in prompts), self.config.prompt_bucket_tokens)
        program = self._program(rows, prompt_len, max_new_tokens, sampling)
        outputs = []
        for wave in range(waves):
            batch = list(prompts[wave * rows : (wave + 1) * rows])
            batch += [batch[0]] * (rows - len(batch))  # pad the last wave with a real prompt
            tokens, lens = self._left_pad(batch, prompt_len)
            key, wave_key = jax.random.split(key)
            outputs.append(
                program(
                    self.params,
                    jax.device_put(tokens, self._rows),
                    jax.device_put(lens, self._rows),
                    wave_key,
                )
            )
        outputs = jax.device_get(outputs)
        cat = lambda i: np.concatenate([o[i] for o in outputs])[:n]
        tokens, logprobs, lengths = cat(0), cat(1), cat(2)
        ended_with_eos = tokens[np.arange(n), np.maximum(lengths - 1, 0)] == self.eos_id
        return Rollout(
            tokens=tokens,
            logprobs=logprobs,
            lengths=lengths,
            truncated=(lengths >= max_new_tokens) & (~ended_with_eos | sampling.ignore_eos),
            decode_iterations=int(sum(int(o[3]) for o in outputs)),
            waves=waves,
        )

    def _left_pad(
        self, prompts: Sequence[np.ndarray], length: int
    ) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.full((len(prompts), length), self.pad_id, np.int32)
        lens = np.zeros(len(prompts), np.int32)
        for i, p in enumerate(prompts):
            tokens[i, length - len(p) :] = p
            lens[i] = len(p)
        return tokens, lens

    def _program(self, rows: int, prompt_len: int, max_new: int, sampling: SamplingParams):
        signature = (rows, prompt_len, max_new, sampling)
        if signature not in self._programs:
            fn = functools.partial(
                _generate,
                self.graphdef,
                max_new=max_new,
                sampling=sampling,
                eos_id=self.eos_id,
                pad_id=self.pad_id,
            )
            self._programs[signature] = jax.jit(
                fn, out_shardings=(self._rows, self._rows, self._rows, self._replicated)
            )
        return self._programs[signature]


def _generate(graphdef, params, prompts, prompt_lens, key, *, max_new, sampling, eos_id, pad_id):
    """The compiled program of one wave: prefill, then decode until every row is done."""
    model = nnx.merge(graphdef, params)
    rows, prompt_len = prompts.shape
    slots = prompt_len + max_new
    pad = prompt_len - prompt_lens  # left padding per row
    slot_ids = jnp.arange(slots)
    key_valid = slot_ids[None, :] >= pad[:, None]  # [C, S]: padding slots are never attended
    sample = functools.partial(
        sample_tokens, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p
    )

    positions = jnp.maximum(jnp.arange(prompt_len)[None, :] - pad[:, None], 0)
    causal = slot_ids[None, None, :] <= jnp.arange(prompt_len)[None, :, None]
    cache = init_cache(model.config, rows, slots)
    hidden, cache = model(prompts, positions, causal & key_valid[:, None, :], cache, 0)
    key, step_key = jax.random.split(key)
    token, logprob = sample(step_key, model.logits(hidden[:, -1]))

    tokens = jnp.full((rows, max_new), pad_id, jnp.int32).at[:, 0].set(token)
    logprobs = jnp.zeros((rows, max_new), jnp.float32).at[:, 0].set(logprob)
    done = (token == eos_id) & (not sampling.ignore_eos)
    lengths = jnp.ones((rows,), jnp.int32)

    def cond(state):
        t, _, _, _, done, _, _ = state
        return (t < max_new) & ~jnp.all(done)

    def body(state):
        t, cache, tokens, logprobs, done, lengths, key = state
        previous = tokens[:, t - 1]
        mask = (slot_ids[None, None, :] <= prompt_len + t - 1) & key_valid[:, None, :]
        position = (prompt_lens + t - 1)[:, None]
        hidden, cache = model(previous[:, None], position, mask, cache, prompt_len + t - 1)
        key, step_key = jax.random.split(key)
        token, logprob = sample(step_key, model.logits(hidden[:, 0]))
        token = jnp.where(done, pad_id, token)
        tokens = tokens.at[:, t].set(token)
        logprobs = logprobs.at[:, t].set(jnp.where(done, 0.0, logprob))
        lengths = lengths + (~done).astype(jnp.int32)
        if not sampling.ignore_eos:
            done = done | (token == eos_id)
        return t + 1, cache, tokens, logprobs, done, lengths, key

    state = (jnp.int32(1), cache, tokens, logprobs, done, lengths, key)
    t, _, tokens, logprobs, _, lengths, _ = jax.lax.while_loop(cond, body, state)
    return tokens, logprobs, lengths, t - 1
