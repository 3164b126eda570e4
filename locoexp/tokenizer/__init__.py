"""Tokenizers for the real workloads: Qwen3's, offline (`qwen3`), or a checkpoint's own (`hf`).

Both satisfy `locoexp.tokenizer.protocol.Tokenizer` and add `render_chat(messages, *,
add_generation_prompt, thinking) -> str`, the model family's chat template.
"""

from locoexp.tokenizer.build import ChatTokenizer, build_tokenizer

__all__ = ["ChatTokenizer", "build_tokenizer"]
