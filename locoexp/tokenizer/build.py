"""`build_tokenizer`: a checkpoint directory's tokenizer when it has one, else Qwen3's built in."""

from collections.abc import Mapping, Sequence
from typing import Protocol

from locoexp.tokenizer.protocol import Tokenizer


class ChatTokenizer(Tokenizer, Protocol):
    def render_chat(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool, thinking: bool
    ) -> str: ...


def build_tokenizer(tokenizer_dir: str | None = None) -> ChatTokenizer:
    """`tokenizer_dir` (a directory or a cached Hub id) with tokenizer files -> that tokenizer
    (transformers, local files only); None or a directory without them (a random-init run) ->
    the real Qwen3 tokenizer."""
    from locoexp.model.hub import resolve_checkpoint
    from locoexp.tokenizer.hf import HFTokenizer, has_tokenizer_files
    from locoexp.tokenizer.qwen3 import Qwen3Tokenizer

    if tokenizer_dir is None:
        return Qwen3Tokenizer()
    directory = resolve_checkpoint(tokenizer_dir)  # a directory or a Hub id in the local cache
    if has_tokenizer_files(directory):
        return HFTokenizer(directory)
    return Qwen3Tokenizer()
