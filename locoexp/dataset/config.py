"""Schema of the `dataset` config group: source, prompt template, caps, batch shape, reward.

Table 1 of the paper gives the defaults of the real workloads (conf/dataset/*.yaml); the
synthetic task is the embedded default that a tiny random policy learns from scratch on CPU;
`random_tokens` is workload W1 of tools/bench_w1.py (random prompt ids, nothing to learn).
Which kinds read which key is `locoexp.applies`' table; a key set under another kind is refused.
"""

import dataclasses
import enum

from locoexp.errors import require


class DatasetKind(enum.Enum):
    synthetic = "synthetic"
    gsm8k = "gsm8k"
    numinamath_cot = "numinamath_cot"
    swe_agent = "swe_agent"
    openmathinstruct2 = "openmathinstruct2"
    random_tokens = "random_tokens"


MATH_PROMPT_TEMPLATE = (
    "{problem}\nPlease reason step by step, and put your final answer within \\boxed{}."
)


class LongPrompts(enum.Enum):
    """What to do with a prompt longer than `max_prompt_tokens` (counted in metrics either way)."""

    drop = "drop"
    truncate = "truncate"  # keep the last max_prompt_tokens tokens


@dataclasses.dataclass(kw_only=True)
class SyntheticTaskConfig:
    """The embedded task: echo a string of digits (see locoexp/dataset/synthetic.py)."""

    num_digits: int = 3  # digits per prompt; the answer repeats them
    num_symbols: int = 10  # distinct digit symbols
    train_size: int = 800  # distinct training prompts
    held_out_size: int = 200  # held-out prompts, disjoint from training prompts

    def __post_init__(self):
        require(
            1 <= self.num_digits <= 12,
            f"dataset.synthetic.num_digits={self.num_digits} must be in [1, 12].",
        )
        require(
            2 <= self.num_symbols <= 10,
            f"dataset.synthetic.num_symbols={self.num_symbols} must be in [2, 10].",
        )
        space = self.num_symbols**self.num_digits
        require(
            self.train_size + self.held_out_size <= space,
            f"dataset.synthetic.train_size + dataset.synthetic.held_out_size = "
            f"{self.train_size + self.held_out_size} "
            f"exceeds the {space} distinct prompts of dataset.synthetic.num_digits="
            f"{self.num_digits} digits over dataset.synthetic.num_symbols={self.num_symbols} "
            "symbols.",
        )


@dataclasses.dataclass(kw_only=True)
class RandomTokensConfig:
    """Workload W1 (tools/bench_w1.py): prompts of `dataset.max_prompt_tokens` random token ids
    over the model's vocabulary (never rendered from text); reward = the share of even ids in a
    completion (locoexp/dataset/random_tokens.py). It measures work per step, not learning."""

    train_size: int = 64  # distinct training prompts
    held_out_size: int = 8  # held-out prompts, drawn apart from the training prompts

    def __post_init__(self):
        for key in ("train_size", "held_out_size"):
            value = getattr(self, key)
            require(value >= 1, f"dataset.random_tokens.{key}={value} must be >= 1.")


@dataclasses.dataclass(kw_only=True)
class DatasetConfig:
    """Where prompts come from and how many of them one step uses (B prompts x G samples)."""

    kind: DatasetKind = DatasetKind.synthetic
    # Source for `datasets.load_dataset(path, name, revision=..., data_files=...)`: a hub id, or a
    # builder ("json", "csv", "parquet") with local `data_files`. Nothing is fetched at run time
    # when data_files point at local files.
    path: str | None = None
    name: str | None = None
    revision: str | None = None
    data_files: str | None = None  # local file(s) of the training split
    eval_data_files: str | None = None  # local file(s) of the held-out split
    train_split: str = "train"
    eval_split: str | None = "test"  # None = the source has no held-out split
    thinking: bool = False  # Qwen3 chat template thinking mode
    max_prompt_tokens: int = 16  # prompt cap
    max_new_tokens: int = 8  # response cap
    long_prompts: LongPrompts = LongPrompts.truncate
    # The expected real length of a sequence, prompt + response tokens, in a step's batch; None =
    # the caps (every sequence P + R tokens, the worst case). Read by the memory plan only: for
    # the paper's trainer layout (`trainer.accumulate=false`), one pass over the per-device batch
    # packed at its real lengths (Algorithm 1, line 4), not at the caps; and for a paged engine
    # (`rollout.kv_cache=paged`), the row its page pool's slots are sized by (locoexp/planner/
    # pages.py; tools/bench_paged_slots.py measures GSM8K's and NuminaMath's). Measured or expected,
    # never fitted to a memory figure (conf/dataset/swe_agent.yaml says where its value is from).
    # Beyond the caps (caps lowered for a small run) it counts as the caps.
    mean_sequence_tokens: int | None = None
    # The user turn of a math prompt; `{problem}` is replaced by the problem text (SWE-agent
    # prompts are the trajectory itself and ignore it). Qwen's recommended math instruction.
    prompt_template: str = MATH_PROMPT_TEMPLATE
    # Use only the first N rows of the training split (Table I3: GSM8K's first 7,424 rows);
    # None = all rows. Applied as a `datasets` split slice, before prompts are rendered.
    max_train_rows: int | None = None
    prompts_per_step: int = 32  # B
    samples_per_prompt: int = 16  # G, the GRPO group size
    seed: int = 0  # prompt order
    # The paper's protocol (Section 3.1, Appendix A): the same `batches_per_pass` batches are
    # seen `passes` times in the same order; None = walk the whole training split each pass.
    batches_per_pass: int | None = None
    passes: int = 1
    reward_workers: int = 0  # 0 = score in the host process; N > 0 = a pool of N processes
    eval_size: int | None = None  # held-out rows scored per evaluation; None = the whole split
    synthetic: SyntheticTaskConfig = dataclasses.field(default_factory=SyntheticTaskConfig)
    random_tokens: RandomTokensConfig = dataclasses.field(default_factory=RandomTokensConfig)

    def __post_init__(self):
        for key in (
            "max_prompt_tokens",
            "max_new_tokens",
            "prompts_per_step",
            "samples_per_prompt",
            "passes",
        ):
            value = getattr(self, key)
            require(value >= 1, f"dataset.{key}={value} is invalid: it must be a positive integer.")
        require(
            self.batches_per_pass is None or self.batches_per_pass >= 1,
            f"dataset.batches_per_pass={self.batches_per_pass} must be a positive integer or null.",
        )
        require(
            "{problem}" in self.prompt_template,
            f"dataset.prompt_template={self.prompt_template!r} must contain {{problem}}.",
        )
        require(
            self.max_train_rows is None or self.max_train_rows >= 1,
            f"dataset.max_train_rows={self.max_train_rows} must be a positive integer or null.",
        )
        require(
            self.reward_workers >= 0, f"dataset.reward_workers={self.reward_workers} must be >= 0."
        )
        require(
            self.eval_size is None or self.eval_size >= 1,
            f"dataset.eval_size={self.eval_size} must be a positive integer or null.",
        )
        require(
            self.mean_sequence_tokens is None or self.mean_sequence_tokens >= 1,
            f"dataset.mean_sequence_tokens={self.mean_sequence_tokens} must be a positive "
            "integer or null (the caps).",
        )
