"""`build_task`: the one place a `DatasetKind` becomes a `Task` (the enum is the registry).

The real workloads tokenize with the checkpoint's own tokenizer when `tokenizer_dir` (the
model's checkpoint directory) has tokenizer files, else with the real Qwen3 tokenizer offline.
"""

from locoexp.dataset.config import DatasetConfig, DatasetKind
from locoexp.dataset.random_tokens import RandomTokensTask
from locoexp.dataset.synthetic import EchoDigitsTask
from locoexp.dataset.task import Task


def needed_columns(kind: DatasetKind) -> tuple[str, ...]:
    """The columns `build_task` reads from each row of `kind` (none for the embedded task)."""
    match kind:
        case DatasetKind.synthetic | DatasetKind.random_tokens:
            return ()
        case DatasetKind.gsm8k:
            return ("question", "answer")
        case DatasetKind.numinamath_cot:
            return ("problem", "solution")
        case DatasetKind.openmathinstruct2:
            return ("problem", "expected_answer")
        case DatasetKind.swe_agent:
            return ("trajectory",)


def build_task(
    config: DatasetConfig, *, tokenizer_dir: str | None = None, vocab_size: int | None = None
) -> Task:
    """Load, render and tokenize the prompts of `config` (once, at start-up); `vocab_size` (the
    model's) is the id range of `random_tokens` prompts."""
    match config.kind:  # no files: `datasets` (~1.4 s to import) is not loaded for these
        case DatasetKind.synthetic:
            return EchoDigitsTask(config.synthetic, seed=config.seed)
        case DatasetKind.random_tokens:
            if vocab_size is None:
                raise ValueError("dataset=random_tokens draws its ids below the model's vocab_size")
            return RandomTokensTask(
                config.random_tokens,
                vocab_size=vocab_size,
                prompt_tokens=config.max_prompt_tokens,
                seed=config.seed,
            )
    from locoexp.dataset.math_task import build_math_task
    from locoexp.dataset.swe_task import build_swe_task
    from locoexp.reward.math import extract_last_boxed, gsm8k_gold
    from locoexp.tokenizer import build_tokenizer

    match config.kind:
        case DatasetKind.gsm8k:
            return build_math_task(
                config,
                build_tokenizer(tokenizer_dir),
                problem_column="question",
                gold=lambda row: gsm8k_gold(str(row["answer"])),
            )
        case DatasetKind.numinamath_cot:
            return build_math_task(
                config,
                build_tokenizer(tokenizer_dir),
                problem_column="problem",
                gold=lambda row: extract_last_boxed(str(row["solution"])),
            )
        case DatasetKind.openmathinstruct2:
            return build_math_task(
                config,
                build_tokenizer(tokenizer_dir),
                problem_column="problem",
                gold=lambda row: str(row["expected_answer"]).strip() or None,
            )
        case DatasetKind.swe_agent:
            return build_swe_task(config, build_tokenizer(tokenizer_dir))
