"""A run's tokenizer written as Hugging Face tokenizer files, beside an exported policy.

`transformers.AutoTokenizer.from_pretrained(dir)` (and vLLM, and `model.checkpoint=dir` here)
must load the tokenizer the policy was trained with:
- a checkpoint's own tokenizer (`HFTokenizer`) is saved as it was loaded;
- the built-in Qwen3 tokenizer becomes the tokenizer.json Qwen3 checkpoints ship: the same BPE
  ranks converted by transformers' `TikTokenConverter`, the 26 control tokens at their ids (the
  `special` flags of Qwen3's tokenizer_config.json: `<tool_call>` onwards are not special), eos
  `<|im_end|>` and Qwen3's chat template;
- the synthetic task's digit tokenizer becomes a word-level tokenizer over single characters;
- W1's id tokenizer becomes a word-level tokenizer whose words are the ids in decimal.

This module only writes files; it never downloads and never changes how a run tokenizes.
"""

import functools
import json
from pathlib import Path

from locoexp.tokenizer.digits import BOS, DIGIT0, EOS, PAD, SEP, DigitTokenizer
from locoexp.tokenizer.hf import HFTokenizer
from locoexp.tokenizer.ids import IdTokenizer
from locoexp.tokenizer.qwen3 import (
    CONTROL_TOKENS,
    QWEN3_CHAT_TEMPLATE_FILE,
    Qwen3Tokenizer,
    qwen_rank_file,
)

FIRST_NOT_SPECIAL = "<tool_call>"  # Qwen3 tokenizer_config.json: "special": false from here on


def write_tokenizer_files(tokenizer, directory: str | Path) -> None:
    """Write `tokenizer` as tokenizer.json + tokenizer_config.json (and what else it needs)."""
    directory = Path(directory)
    match tokenizer:
        case HFTokenizer():
            tokenizer.hf.save_pretrained(str(directory))
        case Qwen3Tokenizer():
            _qwen3_hf_tokenizer().save_pretrained(str(directory))
        case DigitTokenizer():
            _write_digit_tokenizer(tokenizer, directory)
        case IdTokenizer():
            _write_id_tokenizer(tokenizer, directory)
        case _:
            raise TypeError(f"no Hugging Face tokenizer files for {type(tokenizer).__name__}")


@functools.cache
def _qwen3_hf_tokenizer():
    """Qwen3's tokenizer as transformers builds it from the installed rank file (seconds: once)."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    rank_file = str(qwen_rank_file())
    vocab, merges = TikTokenConverter(vocab_file=rank_file).extract_vocab_merges_from_model(
        rank_file
    )
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None)  # adds <|endoftext|> first
    special_until = CONTROL_TOKENS.index(FIRST_NOT_SPECIAL)
    tok.add_tokens(
        [
            AddedToken(t, special=i < special_until, normalized=False)
            for i, t in enumerate(CONTROL_TOKENS)
        ]
    )
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    tok.chat_template = QWEN3_CHAT_TEMPLATE_FILE.read_text()
    return tok


def _write_digit_tokenizer(tokenizer: DigitTokenizer, directory: Path) -> None:
    """One token per character: `<pad> <bos> <eos> =` then the digit symbols, as DigitTokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": PAD, "<bos>": BOS, "<eos>": EOS, "=": SEP}
    vocab |= {str(d): DIGIT0 + d for d in range(tokenizer.num_symbols)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex("."), "isolated")]
    )
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<pad>", "<bos>", "<eos>"])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "model_max_length": 1 << 20,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _write_id_tokenizer(tokenizer: IdTokenizer, directory: Path) -> None:
    """Every id is the word of its decimal digits, words split at whitespace, as IdTokenizer."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({str(i): i for i in range(tokenizer.vocab_size)}, "0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    pad, eos = str(tokenizer.pad_id), str(tokenizer.eos_id)
    # whole words only: the eos id "1" is not the first digit of "17"
    tok.add_special_tokens([AddedToken(t, single_word=True, special=True) for t in (pad, eos)])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos,
        "pad_token": pad,
        "model_max_length": 1 << 20,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
