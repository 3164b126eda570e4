"""A checkpoint directory's own tokenizer, through `transformers.AutoTokenizer` (local files only).

Used when `model.checkpoint` points at a Hugging Face directory with tokenizer files, so prompts
are rendered with that checkpoint's chat template and vocabulary. Nothing is fetched from a hub
and `trust_remote_code` is never enabled.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path

from locoexp.errors import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def has_tokenizer_files(directory: str | Path) -> bool:
    return any((Path(directory) / name).is_file() for name in TOKENIZER_FILES)


class HFTokenizer:
    """The `Tokenizer` protocol over a local `transformers` tokenizer. eos is the chat eos
    (`eos_token` of tokenizer_config.json, `<|im_end|>` for Qwen3); pad falls back to eos."""

    def __init__(self, directory: str | Path):
        from transformers import AutoTokenizer

        if not has_tokenizer_files(directory):
            raise ConfigError(
                f"tokenizer directory {directory} holds none of {', '.join(TOKENIZER_FILES)}."
            )
        self._tok = AutoTokenizer.from_pretrained(
            str(directory), local_files_only=True, trust_remote_code=False
        )
        self.vocab_size = len(self._tok)
        self.eos_id = int(self._tok.eos_token_id)
        pad = self._tok.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_id

    @property
    def hf(self):
        """The underlying `transformers` tokenizer (to save it beside an exported policy)."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        text = self._tok.decode([int(i) for i in ids if 0 <= int(i) < self.vocab_size])
        assert isinstance(text, str), "one id sequence decodes to one string"
        return text

    def render_chat(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool, thinking: bool
    ) -> str:
        text = self._tok.apply_chat_template(
            [dict(m) for m in messages],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=thinking,
        )
        assert isinstance(text, str), "one conversation, untokenized, renders to one string"
        return text
