"""Bytes per device of the trainer's step and of one rollout wave, term by term.

Arithmetic only: nothing here allocates, traces or touches a device, so a plan of Llama-3.1-405B
costs microseconds. It is the closed-form, quick answer: the dry run (`dry_run=true`), the
micro-batches and capacity `trainer.micro_batch_rows=0` / `rollout.capacity=0` resolve to, the
settings a refusal proposes, the start-up check's "clearly fits" below a third of the memory
(`compiled/startup.py`) and the paper grids' plan column. What fits is decided by XLA's compile
of the run's programs (`locoexp/compiled`), so the terms model a TPU's XLA: the quirks of XLA
on CPU (bfloat16 matmuls in float32, remat folded back into the forward pass, ragged_dot as a
masked product against every expert) are not modelled, and a CPU run above a third of its
machine is compiled rather than planned. Every term names the buffer it stands for; the
constants that are not shapes (how many [L, L]-sized copies dense attention keeps, which phase
of the step peaks) were read off XLA's buffer assignment of compiled programs
(`memory_analysis()`; tests/test_planner_xla.py checks them against XLA for TPU), not guessed.

Glossary (bytes per element `a` of model.param_dtype, `a_s` of the sampler's dtype): n
parameters, L trainer row tokens, m rows per micro-batch, H/K query/KV heads, h head_dim, D
width, F MLP width, V vocabulary, layers, C logit chunk, t rollout TP degree, s sequences per
engine replica, P' padded prompt, S = P' + max_new_tokens KV slots, c prefill chunk.

Trainer (locoexp/trainer), FSDP over its Dt devices, gradient accumulation over micro-batches
and one AdamW update per batch:
  resident: params + AdamW m and v (optax keeps them in the param dtype) [+ KL reference],
    each n*a/Dt; the batch's int32 inputs.
  gradients n*a/Dt; with more than one micro-batch (locoexp/trainer/micro.py) one
    micro-batch's gradients beside the float32 accumulator n*4/Dt, and with bfloat16 params two
    more float32 copies (the micro-batch's gradients cast, and the sum with the head's
    gradient); XLA: float32 at the tiny_qwen Table 1 shape and a Qwen-vocabulary one, bfloat16
    at the grouped-query shape (tests/test_planner_xla.py).
  gathered block: the FSDP all-gather of the layer being computed (Dt > 1 only).
  activations of one micro-batch of m x L tokens, by `trainer.remat` (`_saved_per_token`) plus
    the working set of the one block being differentiated (`_working_per_token`); `offload`
    keeps save_matmuls' outputs in host memory (reported, not checked: host RAM is not a
    hardware key) and brings one block's back at a time.
  head (trainer/head.py), run by each device on its own rows and loss slots: float32 [V, D]
    buffers (`_head_gradient`) and one chunk's [C, V]
    float32 logits. In one shot it runs once over all loss slots (their hidden states and
    gradient, D at `a`) after the forward, and its chunk temporaries are dead before the
    backward pass produces parameter gradients, so the step's peak holds the larger of the
    two, not both (XLA: the tiny_qwen-shaped step). With micro-batches it runs inside each
    micro-batch's vjp, over that micro-batch's slots: the chunk's logits, the dW matmul's own
    [V, D] output beside the accumulator (XLA on CPU does not add a matmul into its operand)
    and the micro-batch's dLoss/dhidden (m*L*D at `a`) are alive with its activations (its
    residuals) and the gradient sums.
Publication under `da` (`publication_bytes`): each trainer device gathers a whole replica in
  the sampler's dtype after its step; on a CPU machine Ray's object store is sized to hold
  the published versions (`plan.object_store_bytes`).
Engine (locoexp/rollout), one replica per TP group of t devices:
  weights: q, o and the MLP split over t, k and v too while t <= K (replicated above),
    the embedding and output head split by vocabulary when t divides V (replicated
    otherwise), norms replicated (locoexp/rollout/sharding.py);
  KV cache of one wave: s*S*layers*2*ceil(K/t)*h*a_s (KV heads replicated when t > K);
    paged (`rollout.kv_cache=paged`): the pool, N pages of `page` tokens per replica at the
    same bytes per token (locoexp/rollout/paged_slots.py; N is the plan's, planner/pages.py),
    which a compaction hands back in place (`_compaction`);
  prefill of one chunk of c tokens: float32 scores s*(H/t)*c*P', two copies (scores and
    probabilities; four with a bfloat16 sampler, which also casts them) and the prompt's
    P'-slot KV cache (the chunk loop's carry, widened to S slots after); decode: the
    float32 [s, V] logits, two copies (logits and log-softmax), split by vocabulary with the
    head (a top-k sampler gathers them: not counted).
Mixture of experts (locoexp/model/moe.py; E experts, k per token, I expert width, EP degree e):
  the [E, ...] expert stacks are split E/e per device (the engine's `rollout.expert_parallel`,
  the trainer's `trainer.expert_parallel`; FSDP already splits the trainer's, so there EP
  shrinks only the gathered block); a Qwen3-MoE block has no dense MLP (Gemma4's has both).
  Routed tokens' buffers (`_routed_per_token`), dropless (no capacity factor): each device
  takes every token of its expert group (e times its own in the trainer, whose rows are split
  over `expert`; the engine's replica already shares its rows) and holds, per MoE layer, the
  routed copies [N*k, D], the experts' gate, up and GLU outputs [N*k, I] each, their output
  [N*k, D] and the float32 router logits and probabilities [N, E] (grouped matmuls: a TPU's
  ragged_dot holds no product against experts a token is not routed to); the backward pass
  keeps them per layer, the engine one layer's in a prefill chunk or a decode step.
"""

import dataclasses
import functools
import math

import jax

from locoexp.model.config import DType, ModelConfig, attention_block
from locoexp.model.moe import EXPERT
from locoexp.model.sizes import abstract_params, count_block_parameters, count_embedding_parameters
from locoexp.rollout.sharding import TENSOR, param_spec, vocab_shards
from locoexp.trainer.config import AttentionKind, RematPolicy

GIB = 2**30
F32 = 4
BYTES = {DType.float32: 4, DType.bfloat16: 2}
# Dense attention keeps four float32 [H, L] rows per token and layer through the backward pass:
# the scores, the masked scores, the probabilities and their gradient (XLA, tests/test_planner_xla).
DENSE_SCORE_COPIES = 4
# Prefill keeps float32 [s, H, c, P'] scores, masked scores and probabilities beside the prompt's
# KV cache (the chunk loop's carry): fitted to XLA (CPU) at eight engine shapes (chunks of 1/4 to
# all of the prompt; tests/test_planner_xla.py checks three), within 0.79-1.15 when the scores
# spanned S slots; since they span P' (session 19) the checked shapes read 1.00-1.23.
BLOCKWISE_TILE_COPIES = 5  # scores, probabilities, their gradient, the score gradient, mask
PREFILL_SCORE_COPIES = {DType.float32: 2, DType.bfloat16: 4}
DECODE_LOGIT_COPIES = 2  # logits and their log-softmax for sampling


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerShape:
    """What one trainer device holds and computes at the caps."""

    devices: int  # Dt, the FSDP axis
    rows: int  # packed rows per device
    row_tokens: int  # L
    micro_batch_rows: int  # m
    loss_slots: int  # K loss positions per device
    logit_chunk: int  # C
    attention: AttentionKind
    attention_block: int
    remat: RematPolicy
    kl_reference: bool
    # adapter=lora: the adapters' parameter count (what trains: gradients, AdamW state and the
    # KL reference are theirs, the base is frozen); 0 = full fine-tuning
    adapter_parameters: int = 0
    # of those, the base weights PEFT's `modules_to_save` names (trained in full, no copy: they
    # move from the frozen base to what trains, so they add no parameter memory)
    adapter_saved_parameters: int = 0
    # adapter=lora: rank x the adapted projections of one block, the elements per token of the
    # low-rank activations x A every block keeps for the backward pass (PEFT's dropout-free
    # path: one [tokens, r] per projection), which grow with `adapter.rank`
    adapter_rank_per_block: int = 0
    expert_parallel: int = 1  # e, the trainer's `expert` axis

    @property
    def micro_batches(self) -> int:
        return -(-self.rows // self.micro_batch_rows)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerMemory:
    """Bytes per trainer device, by term."""

    params: int
    gradients: int  # gradients; with micro-batches a float32 accumulator and one micro-batch's
    optimizer: int  # AdamW m and v
    reference: int  # the KL reference policy (algo.kl_coef > 0), else 0
    inputs: int  # the packed batch's int32 / float32 arrays
    gathered_block: int
    activations: int  # one micro-batch, by the remat policy
    # the fused head's float32 [V, D] buffers (`_head_gradient`)
    head_gradient: int
    head_chunk: int  # one chunk's logits and the hidden states' gradient at the head's input
    head_in_micro_batches: bool  # the head runs beside the activations and gradient sums
    offloaded: int  # remat=offload: saved activations in host memory (not on the device)
    # adapter=lora: the merged policy W + s A B publication builds after the step (`Trainer.
    # params`), a shard of the base beside the resident state
    merged: int = 0

    @property
    def resident(self) -> int:
        """What outlives a step: params, optimizer state and the reference policy."""
        return self.params + self.optimizer + self.reference

    @property
    def total(self) -> int:
        transient = self.inputs + self.gathered_block + self.activations + self.head_gradient
        if self.head_in_micro_batches:
            return self.resident + transient + self.gradients + self.head_chunk
        return self.resident + transient + max(self.gradients, self.head_chunk)


def _block_elements_per_token(c: ModelConfig) -> int:
    """Elements one block keeps per token for a remat-free backward, attention scores aside: the
    block input and its norm (2D), q and k before the q/k norm and after RoPE, v, the o_proj
    input (Hh), the residual and its norm (2D), gate, up and their product (3F)."""
    qk = (c.num_heads + c.num_kv_heads) * c.head_dim * (2 if c.qk_norm else 1)
    dense_mlp = 0 if c.moe and not c.gemma4 else 3 * c.mlp_dim  # Qwen3-MoE: experts only
    return (
        4 * c.hidden_dim + qk + c.num_kv_heads * c.head_dim + c.num_heads * c.head_dim + dense_mlp
    )


def _routed_per_token(c: ModelConfig, expert_parallel: int, *, gathered: bool = True) -> int:
    """Bytes of one MoE layer's routed buffers per token of the device's own (see the module
    docstring): the k routed copies of the token and their combined output (2D), the gate, up
    and GLU activations (3I), at `a`, for every token of the expert group (e of them per own
    token; `gathered=False` for the engine, whose expert group shares its rows), and the
    float32 router logits and probabilities (2E). 0 for a dense model."""
    if not c.moe:
        return 0
    k, d, i = c.experts_per_token, c.hidden_dim, c.expert_mlp_dim
    routed = k * (2 * d + 3 * i)
    group = expert_parallel if gathered else 1
    return group * routed * BYTES[c.activation_dtype] + 2 * c.num_experts * F32


def _float32_copies_per_token(c: ModelConfig) -> int:
    """Bytes one block keeps per token for its float32 numerics whatever the param dtype: the
    two RMSNorms' float32 inputs (2D), q and k in float32 for the q/k norm and for RoPE, and
    silu's sigmoid (F, at the param dtype). Read off XLA: tiny_qwen's blockwise train step
    grows by 124 KB per token, 78 KB of it in the terms above."""
    qk = (c.num_heads + c.num_kv_heads) * c.head_dim * (2 if c.qk_norm else 1)
    return (2 * c.hidden_dim + qk) * F32 + c.mlp_dim * BYTES[c.activation_dtype]


def _matmul_outputs_per_token(c: ModelConfig) -> int:
    """Elements `save_matmuls` keeps per token and block: the block input, q/k/v, the attention
    output, o_proj's output, gate and up, down's output."""
    qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    return 3 * c.hidden_dim + qkv + c.num_heads * c.head_dim + 2 * c.mlp_dim


def _attention_bytes_per_token(c: ModelConfig, shape: TrainerShape) -> int:
    """Attention state one block keeps per token beyond q, k, v and its output."""
    if shape.attention is AttentionKind.dense:  # [H, L] float32 copies and the [L] bool mask
        return DENSE_SCORE_COPIES * c.num_heads * shape.row_tokens * F32 + shape.row_tokens
    # the kernel's own copy of its output (blocked) and the log-sum-exp per head
    return c.num_heads * c.head_dim * BYTES[c.activation_dtype] + c.num_heads * F32


def _saved_per_token(c: ModelConfig, shape: TrainerShape) -> int:
    """Bytes per token the backward pass keeps from every block, by remat policy (activations
    at `model.compute_dtype`, else the param dtype)."""
    a = BYTES[c.activation_dtype]
    low_rank = shape.adapter_rank_per_block * a
    match shape.remat:
        case RematPolicy.none:
            per_block = _block_elements_per_token(c) * a + _attention_bytes_per_token(c, shape)
            per_block += low_rank
            per_block += _float32_copies_per_token(c) + _routed_per_token(c, shape.expert_parallel)
        case RematPolicy.block:
            per_block = c.hidden_dim * a
        case RematPolicy.save_matmuls:  # XLA keeps the float32 copies too (measured)
            per_block = _matmul_outputs_per_token(c) * a + _float32_copies_per_token(c)
            per_block += low_rank
        case RematPolicy.offload:
            return 0  # save_matmuls' outputs, in host memory; brought back block by block
    return c.num_layers * per_block + 2 * c.hidden_dim * a  # + the final norm's input, output


def _working_per_token(c: ModelConfig, shape: TrainerShape) -> int:
    """Bytes per token of the one block that is recomputed and differentiated at a time."""
    if shape.remat is RematPolicy.none:
        return 0  # already counted in what every block keeps
    a = BYTES[c.activation_dtype]
    recomputed = _block_elements_per_token(c) * a + _attention_bytes_per_token(c, shape)
    recomputed += _float32_copies_per_token(c) + _routed_per_token(c, shape.expert_parallel)
    recomputed += shape.adapter_rank_per_block * a
    if shape.remat is RematPolicy.offload:  # this block's saved outputs, back from the host
        recomputed += _matmul_outputs_per_token(c) * a
    return recomputed


def _attention_tiles(c: ModelConfig, shape: TrainerShape) -> int:
    """Blockwise attention's backward holds [m, H, block, block] float32 tiles of one block pair
    (scores, probabilities, their gradients, the mask; the micro-batch's m rows run together)
    and a float32 dq of the micro-batch."""
    if shape.attention is AttentionKind.dense:
        return 0
    block = attention_block(shape.row_tokens, shape.attention_block)
    tiles = BLOCKWISE_TILE_COPIES * shape.micro_batch_rows * c.num_heads * block * block * F32
    dq = shape.micro_batch_rows * shape.row_tokens * c.num_heads * c.head_dim * F32
    return tiles + dq


def _head_gradient(c: ModelConfig, *, micro: bool, devices: int) -> int:
    """The fused head's float32 [V, D] buffers (see `TrainerMemory.head_gradient`). Each
    device runs the head on its own rows and slots (`Trainer._head_on_own_rows`): its partial
    dLoss/dW and the float32 weight its chunks multiply are whole, the sum reduce-scattered
    along V and carried over micro-batches is 1/devices; XLA at 4 CPU devices (Qwen3's
    vocabulary, micro-batches of one row): plan / XLA 0.88. On one device the partial is the
    gradient itself (one shot: plan / XLA 1.14, tests/test_planner_xla.py). Before the head ran
    per device, XLA's partitioner laid out every device's slots on each device ([K, D]: two
    buffers of 32 GiB per device in Table E1's Qwen3-8B cell on XLA-TPU)."""
    whole = c.vocab_size * c.hidden_dim * F32
    if devices == 1:
        return whole if not micro else 3 * whole
    return 2 * whole + -(-whole // devices)


def estimate_trainer(c: ModelConfig, n: int, shape: TrainerShape) -> TrainerMemory:
    """Bytes per device of one FSDP trainer device holding `shape`; `n` parameters."""
    a, dt = BYTES[c.param_dtype], shape.devices
    base = math.ceil(n / dt) * a
    trained = shape.adapter_parameters or n  # what gradients and AdamW state are kept for
    shard = math.ceil(trained / dt) * a
    added = shape.adapter_parameters - shape.adapter_saved_parameters  # the LoRA factors
    tokens = shape.micro_batch_rows * shape.row_tokens
    micro = shape.micro_batches > 1
    # one shot: every loss slot's hidden state and gradient; micro-batches: the micro-batch's
    # dLoss/dhidden over its m x L positions (the head gathers its slots chunk by chunk)
    slots = tokens if micro else shape.loss_slots
    head_states = (1 if micro else 2) * slots * c.hidden_dim * BYTES[c.activation_dtype]
    chunk = min(shape.logit_chunk, max(slots, 1))
    offloaded = 0
    if shape.remat is RematPolicy.offload:
        offloaded = tokens * c.num_layers * _matmul_outputs_per_token(c) * BYTES[c.activation_dtype]
    return TrainerMemory(
        params=base + math.ceil(added / dt) * a,
        gradients=(1 if a == F32 else 3) * math.ceil(trained / dt) * F32 + shard
        if micro
        else shard,
        optimizer=2 * shard,
        reference=shard if shape.kl_reference else 0,
        inputs=shape.rows * shape.row_tokens * 3 * 4 + shape.loss_slots * 5 * 4,
        gathered_block=_gathered_block(c, shape.expert_parallel) * a if dt > 1 else 0,
        activations=tokens * (_saved_per_token(c, shape) + _working_per_token(c, shape))
        + _attention_tiles(c, shape),
        head_gradient=_head_gradient(c, micro=micro, devices=dt),
        head_chunk=head_states + chunk * c.vocab_size * F32,
        head_in_micro_batches=micro,
        offloaded=offloaded,
        merged=base if shape.adapter_parameters else 0,
    )


def _gathered_block(c: ModelConfig, expert_parallel: int) -> int:
    """Elements of the layer FSDP gathers: the whole block, its experts E/e (each device's
    `expert` slice; the routed tokens come to them)."""
    if not c.moe:
        return count_block_parameters(c)
    return count_block_parameters(c, experts=c.num_experts // expert_parallel)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineShape:
    """What one device of a rollout engine holds in one wave."""

    tensor_parallel: int  # t
    sequences_per_replica: int  # s, in one wave
    prompt_tokens: int  # P', the padded prompt
    new_tokens: int
    prefill_chunk: int  # c
    dtype: DType  # the sampler's weights and KV cache
    # rollout.scheduler=continuous: the engine's requests N (0 = static waves). The engine then
    # keeps every request's outputs and prompt on each device, and compacting its last rows
    # briefly holds a cache of at most half the slots beside the whole one.
    continuous_requests: int = 0
    expert_parallel: int = 1  # e: each replica is e x t devices, the experts split E/e
    # rollout.kv_cache=paged: tokens a page holds and pages per replica's pool (0: dense cache)
    page_tokens: int = 0
    pool_pages: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineMemory:
    """Bytes per rollout device, by term."""

    weights: int
    kv_cache: int  # one wave
    prefill: int  # one prefill chunk's attention temporaries
    decode: int  # one decode iteration's logits
    outputs: int  # tokens and log-probs of the wave (continuous: of every request, + prompts)
    compaction: int = 0  # continuous batching: the narrower cache beside the whole one

    @property
    def total(self) -> int:
        transient = max(self.prefill, self.decode, self.compaction)
        return self.weights + self.kv_cache + transient + self.outputs


def _engine_weight_elements(c: ModelConfig, t: int, e: int = 1) -> int:
    """Elements per device of a TP-t (EP-e) replica (locoexp/rollout/sharding.py): q, o and the
    MLP split over t; k and v split too while t <= K, replicated above; the embedding and
    output head split by vocabulary when t divides it, else replicated; norms replicated.
    Mixture-of-experts and Gemma4 models are read off the traced model instead."""
    if c.moe or c.gemma4:
        return _traced_engine_weight_elements(dataclasses.astuple(c), t, e)
    q_o = 2 * c.hidden_dim * c.num_heads * c.head_dim // t
    k_v = 2 * c.hidden_dim * c.num_kv_heads * c.head_dim // (t if t <= c.num_kv_heads else 1)
    mlp = 3 * c.hidden_dim * c.mlp_dim // t
    norms = 2 * c.hidden_dim + (2 * c.head_dim if c.qk_norm else 0)
    per_layer = q_o + k_v + mlp + norms
    embeddings = count_embedding_parameters(c) // vocab_shards(c, t)
    return c.num_layers * per_layer + embeddings + c.hidden_dim


@functools.lru_cache(maxsize=16)
def _traced_engine_weight_elements(fields: tuple, t: int, e: int) -> int:
    """Per-device elements of a TP-t, EP-e replica of the model whose `ModelConfig` fields are
    `fields`, from its traced parameters and the engine's own layouts (`param_spec`): the
    stacked experts [E, ...] split E/e (replicated over TP), Gemma4's global layers have their
    own shapes."""
    names = [f.name for f in dataclasses.fields(ModelConfig)]
    c = ModelConfig(**dict(zip(names, fields, strict=True)))
    total = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_params(c)):
        spec = param_spec(path, c, t, experts=e > 1)
        split = t if TENSOR in spec else e if EXPERT in spec else 1
        total += math.prod(leaf.shape) // split
    return total


def kv_bytes_per_token(c: ModelConfig, shape: EngineShape) -> int:
    """KV cache bytes of one token on one device of a TP-t replica: every layer's keys and
    values of its ceil(K/t) KV heads (replicated when t > K), in the sampler's dtype."""
    kv_heads = math.ceil(c.num_kv_heads / shape.tensor_parallel)
    return c.num_layers * 2 * kv_heads * c.head_dim * BYTES[shape.dtype]


def estimate_engine(c: ModelConfig, shape: EngineShape) -> EngineMemory:
    """Bytes per device of one TP shard of an engine replica in one wave."""
    t, s = shape.tensor_parallel, shape.sequences_per_replica
    weights = _engine_weight_elements(c, t, shape.expert_parallel) * BYTES[shape.dtype]
    per_token = kv_bytes_per_token(c, shape)
    if shape.page_tokens:  # the pool; the dense cache reserves S slots per sequence
        kv_cache = shape.pool_pages * shape.page_tokens * per_token
    else:
        kv_cache = s * (shape.prompt_tokens + shape.new_tokens) * per_token
    chunk = min(shape.prefill_chunk, shape.prompt_tokens)
    heads = math.ceil(c.num_heads / t)
    sampler = dataclasses.replace(c, param_dtype=shape.dtype)
    routed = _routed_per_token(sampler, shape.expert_parallel, gathered=False)
    return EngineMemory(
        weights=weights,
        kv_cache=kv_cache,
        # a chunk attends the prompt's P slots; its cache is widened to S after
        # paged: the same dense prompt cache, then copied into pages (paged_slots.write_prompts)
        prefill=PREFILL_SCORE_COPIES[shape.dtype] * s * heads * chunk * shape.prompt_tokens * F32
        + s * shape.prompt_tokens * per_token
        + s * chunk * routed,
        decode=DECODE_LOGIT_COPIES * s * c.vocab_size // vocab_shards(c, t) * F32 + s * routed,
        outputs=_engine_outputs(shape),
        compaction=_compaction(kv_cache, shape),
    )


def _compaction(kv_cache: int, shape: EngineShape) -> int:
    """Continuous batching's compaction: a dense cache's narrower copy (at most half the slots)
    beside the whole one. A paged engine's compaction moves page-table rows only and its pools
    go in donated and come back in place (`SlotPrograms.compact_args`): nothing cache-sized."""
    if not shape.continuous_requests or shape.page_tokens:
        return 0
    return kv_cache // 2


def _engine_outputs(shape: EngineShape) -> int:
    """Tokens and log-probs (4 + 4 bytes per new token) of one wave's rows per device; under
    continuous batching of all N requests, with their int32 prompts, on every device."""
    if not shape.continuous_requests:
        return shape.sequences_per_replica * shape.new_tokens * 2 * 4
    return shape.continuous_requests * (shape.new_tokens * 2 * 4 + shape.prompt_tokens * 4)


def publication_bytes(c: ModelConfig, dtype: DType) -> int:
    """One whole replica of the weights in the sampler's `dtype`: what each device of a `da`
    trainer host all-gathers after its step (`placement.ray.hosts.publish_to_object_store`,
    beside its params and AdamW state), and what one published version occupies in Ray's object
    store."""
    return _engine_weight_elements(c, 1) * BYTES[dtype]
