"""Schema of the `rollout` config group: which engine generates, how, and how many at once."""

import dataclasses
import enum

from locoexp.errors import require
from locoexp.model.config import DType
from locoexp.rollout.straggler import StragglerConfig


class EngineKind(enum.Enum):
    jax = "jax"  # built in: compiled prefill + decode loop with a KV cache
    vllm = "vllm"  # vLLM / tpu-inference where installed


class Scheduler(enum.Enum):
    """How the JAX engine runs more requests than it has slots (locoexp/rollout/scheduling.py)."""

    waves = "waves"  # static waves of `capacity` rows, each decoded until its longest row ends
    # a finished row's slot takes the next waiting request on device; the tail is compacted
    continuous = "continuous"


class KVCacheKind(enum.Enum):
    """How the JAX engine keeps its KV cache (locoexp/rollout/paged_slots.py)."""

    dense = "dense"  # P' + M slots per row, reserved for its whole life
    # a pool of `page_tokens`-token pages per replica, taken as a row grows and given back when
    # it ends; decode attention reads only each row's own pages (vLLM's PagedAttention)
    paged = "paged"


@dataclasses.dataclass(kw_only=True)
class RolloutConfig:
    engine: EngineKind = EngineKind.jax
    temperature: float = 1.0
    top_k: int = 0  # 0 = off (no top-k mask is computed, as the paper's sampler)
    top_p: float = 1.0  # 1.0 = off
    # Paper's scale study: every completion runs to max_new_tokens, EOS is not a stop.
    ignore_eos: bool = False
    # Max concurrent sequences per engine; larger batches generate in waves (Appendix E: "two
    # waves at 8 chips"), each with a KV cache of capacity x (prompt bucket + max_new_tokens).
    # 0 = the most that fit: the memory plan (locoexp/planner) resolves it at start-up (an engine
    # built directly with 0 runs all its requests in one wave).
    capacity: int = 0
    # At most this many sequences per data-parallel replica at a time when the plan sizes the
    # capacity (`rollout.capacity=0`): vLLM's `max_num_seqs` of each DP rank. Table 3's engines
    # held 64 per replica, so GSM8K at 8 chips generates "in two waves" (Sec. 4.2, Fig. 7 note)
    # where the memory alone would hold the step's 128 per replica. 0 = no cap (the memory
    # decides).
    max_sequences_per_replica: int = 0
    # How the JAX engine fills its `capacity` slots: `continuous` (App. G's engines decode "a
    # step's 32 rows in one continuous batch") refills a slot as soon as its row ends and
    # narrows the batch as the last rows finish, so rollout time follows the tokens generated;
    # `waves` decodes each wave until its longest row ends. vLLM always schedules continuously.
    # Continuous is the default: tools/bench_variable_lengths.py (experiments/LOG.md).
    scheduler: Scheduler = Scheduler.continuous
    # TP degree per engine replica (Section 4.1: TP1 for small models, up to TP32 in Table H1).
    # The JAX engine shards attention heads and the MLP width over TP devices; its data-parallel
    # replicas are the engine's devices / TP. With TP above model.num_kv_heads each device keeps
    # a copy of the one KV head its query heads read (as vLLM does), so TP must then be a
    # multiple of the KV heads; below, it must divide them.
    tensor_parallel: int = 1
    # EP degree per engine replica of a mixture-of-experts model: each replica becomes EP x TP
    # devices with the [E, ...] expert weights split E/EP per device over an `expert` mesh axis
    # and the routed tokens summed over it by one all-reduce per MoE layer (locoexp/rollout/
    # sharding.py). It must divide model.num_experts and the engine's devices / TP. 0 = the most
    # that divide both (MaxText's Gemma4-26B recipe samples at EP8 x TP1); a dense model runs
    # at 1.
    expert_parallel: int = 0
    # Prompts are padded to the next power of two, at least this long, so a run compiles few shapes.
    prompt_bucket_tokens: int = 16
    # The JAX engine prefills prompts in chunks of this many tokens per sequence, so attention
    # scores are [chunk, slots] per sequence and layer, never [prompt, prompt] (15,360-token
    # SWE-agent prompts). A prompt bucket above it is rounded up to whole chunks.
    prefill_chunk_tokens: int = 512
    # The JAX engine's KV cache: `dense` keeps P' + M slots per row for the row's whole life and
    # attends over all of them; `paged` keeps a pool of pages per data-parallel replica, a page
    # table per slot, takes pages as a row grows and returns them when it ends. When the pool
    # runs dry a row waits for pages; when every live row waits, the last one is preempted and
    # recomputed from its prompt (vLLM's rule). Dense stays the default until paged is as fast
    # on W1 (experiments/LOG.md, session 25).
    kv_cache: KVCacheKind = KVCacheKind.dense
    page_tokens: int = 16  # tokens a page holds (rollout.kv_cache=paged)
    # Pages in each replica's pool, per layer. Fewer pages than every slot at its caps are the
    # saving: rows of their real lengths share them. It must hold one row at its caps
    # (dataset.max_prompt_tokens + dataset.max_new_tokens). null = the plan's (locoexp/planner/
    # pages.py): on an accelerator what each device has left beside the weights and the
    # transients, at most every slot at its caps; on hardware=cpu every slot at its caps (an
    # engine built directly, without a plan, takes that too). Under `capacity: 0` the plan then
    # sizes the slots by the pool and the expected row, `dataset.mean_sequence_tokens` (the caps
    # where null), and the dry run states both; rows longer than expected make the engine wait
    # and preempt (above), never run out of memory.
    kv_cache_pages_per_replica: int | None = None
    # Weights, activations and KV cache of the engine; null = model.param_dtype. bfloat16 with a
    # float32 trainer is Table I3's cost-to-learn recipe: publication casts into it.
    param_dtype: DType | None = None
    eval_temperature: float = 0.7  # held-out evaluation sampling (Table I3: T 0.7)
    # Colocated placements (co, single_controller) with the JAX engine: drop the engine's weight
    # copy before the train phase; the publication right after training loads fresh ones. The
    # paper's Llama-3.1-405B at TP16 fit only by freeing the sampler's weights and KV cache
    # during training (Table H2); the JAX engine's KV cache lives only within a wave already.
    # The plan then counts no engine weights in the train step. Refused under placement=da,
    # whose engines never share devices with the trainer.
    release_weights_during_training: bool = False
    # Stragglers made on purpose: one rollout host per step slowed by a time or a factor (Eq. 4's
    # A, which the paper simulated; `rollout/straggler.py`), every placement and engine.
    straggler: StragglerConfig = dataclasses.field(default_factory=StragglerConfig)

    # rollout=vllm only (locoexp/rollout/vllm_engine.py; `locoexp.applies` refuses them under
    # rollout=jax): the JAX engine is data-parallel over its devices / tensor_parallel and sizes
    # its cache per wave.
    # Engine replicas per host (the paper: DP8 x TP1 per host). vLLM runs DP > 1 inside one
    # process on TPU only; on GPU/CPU it needs one process per replica, which is refused.
    data_parallel: int = 1
    # vLLM gpu_memory_utilization: share of each accelerator's memory for weights + KV cache. The
    # JAX trainer shares the chips, so keep it and XLA_PYTHON_CLIENT_MEM_FRACTION under 1 together.
    memory_fraction: float = 0.9
    # Fixed KV cache size per engine (vLLM kv_cache_memory_bytes); 0 = from memory_fraction. On
    # CPU give a size: vLLM-CPU reserves it from host memory (its VLLM_CPU_KVCACHE_SPACE).
    kv_cache_gib: float = 0.0
    # vLLM: no CUDA graphs / torch.compile. Starts in seconds instead of minutes; decodes slower.
    enforce_eager: bool = False

    def __post_init__(self):
        # Training samples must be random: at temperature 0 every sample of a GRPO group is the
        # same greedy completion, so the group advantage and the gradient are zero.
        require(
            self.temperature > 0,
            f"rollout.temperature={self.temperature} must be > 0 for training (0 = greedy gives "
            "every sample of a group the same completion); greedy evaluation is "
            "rollout.eval_temperature=0.",
        )
        require(self.top_k >= 0, f"rollout.top_k={self.top_k} must be >= 0 (0 = off).")
        require(0 < self.top_p <= 1, f"rollout.top_p={self.top_p} must be in (0, 1].")
        self._check_capacity()
        require(
            self.tensor_parallel >= 1,
            f"rollout.tensor_parallel={self.tensor_parallel} must be >= 1.",
        )
        require(
            self.expert_parallel >= 0,
            f"rollout.expert_parallel={self.expert_parallel} must be >= 0 (0 = the most that "
            "divide model.num_experts and the engine's devices / TP).",
        )
        require(
            self.prompt_bucket_tokens >= 1,
            f"rollout.prompt_bucket_tokens={self.prompt_bucket_tokens} must be >= 1.",
        )
        require(
            self.prefill_chunk_tokens >= 1,
            f"rollout.prefill_chunk_tokens={self.prefill_chunk_tokens} must be >= 1.",
        )
        require(self.page_tokens >= 1, f"rollout.page_tokens={self.page_tokens} must be >= 1.")
        require(
            self.kv_cache_pages_per_replica is None or self.kv_cache_pages_per_replica >= 1,
            f"rollout.kv_cache_pages_per_replica={self.kv_cache_pages_per_replica} must be >= 1 "
            "(or null: every slot at its caps).",
        )
        require(
            self.eval_temperature >= 0,
            f"rollout.eval_temperature={self.eval_temperature} must be >= 0 (0 = greedy).",
        )
        require(
            self.data_parallel >= 1, f"rollout.data_parallel={self.data_parallel} must be >= 1."
        )
        require(
            0 < self.memory_fraction <= 1,
            f"rollout.memory_fraction={self.memory_fraction} must be in (0, 1].",
        )
        require(
            self.kv_cache_gib >= 0,
            f"rollout.kv_cache_gib={self.kv_cache_gib} must be >= 0 (0 = from memory_fraction).",
        )

    def _check_capacity(self) -> None:
        """The engine's slots: a fixed capacity, or the plan's under an optional cap."""
        require(
            self.capacity >= 0,
            f"rollout.capacity={self.capacity} must be >= 0 (0 = the most that fit).",
        )
        require(
            self.max_sequences_per_replica >= 0,
            f"rollout.max_sequences_per_replica={self.max_sequences_per_replica} must be >= 0 "
            "(0 = no cap).",
        )
        require(
            not (self.capacity and self.max_sequences_per_replica),
            f"rollout.max_sequences_per_replica={self.max_sequences_per_replica} caps the "
            f"capacity the plan sizes, but rollout.capacity={self.capacity} fixes it: set one "
            "of the two.",
        )

    def at_capacity(self, capacity: int, *, pool_pages: int | None = None) -> "RolloutConfig":
        """This config with its capacity fixed at `capacity` (the plan's or XLA's), the
        per-replica cap dropped: the sized capacity already honours it. A paged engine's pool
        left null takes `pool_pages` (the plan's pool, which its capacity was sized by; the
        engine's own null would reserve every slot at its caps)."""
        pages = self.kv_cache_pages_per_replica
        if self.kv_cache is KVCacheKind.paged and pages is None and pool_pages:
            pages = pool_pages  # a plan's empty pool (no memory left) stays the engine's null
        return dataclasses.replace(
            self, capacity=capacity, max_sequences_per_replica=0, kv_cache_pages_per_replica=pages
        )


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Static per-call sampling settings (each distinct value compiles once)."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    ignore_eos: bool = False
