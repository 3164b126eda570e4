"""The offline Qwen3 tokenizer against transformers' Qwen2 tokenizer built from the same ranks.

The reference is independent of tiktoken's BPE: transformers' `TikTokenConverter` turns the
`qwen.tiktoken` ranks into a vocabulary and merge list, `Qwen2Tokenizer` (the class Qwen3
checkpoints name in tokenizer_config.json) adds NFC and the pre-tokenizer, and the 26 control
tokens are added at their ids with the `special` flags of Qwen3's tokenizer_config.json.
"""

import pytest

from locoexp.tokenizer import build_tokenizer
from locoexp.tokenizer.hf import HFTokenizer
from locoexp.tokenizer.qwen3 import (
    CONTROL_TOKENS,
    ENDOFTEXT_ID,
    IM_END_ID,
    QWEN3_CHAT_TEMPLATE_FILE,
    VOCAB_SIZE,
    Qwen3Tokenizer,
    qwen_rank_file,
)

TEMPLATE = QWEN3_CHAT_TEMPLATE_FILE.read_text()
TEXTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May.",
    "1234567890 3.14159 -42 1,000,000 $18 12:30",
    "数学题：小明有 12 个苹果，吃了 3 个。日本語のテキストも。한국어",
    "tabs\t\tand   spaces    \n\n\n   trailing   \r\n  ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok<|endoftext|>",
    '<tool_call>{"a": 1}</tool_call><tool_response>x</tool_response><|fim_prefix|><|file_sep|>',
    "don't I'LL we've emoji 🤖🚀 café (NFC: cafe\u0301) ```python\ndef f(x):\n    return x**2\n```",
    "\\boxed{\\frac{1}{2}} and $x^2 + y^2 = z^2$",
]
FIRST_SPECIAL = 151643
NOT_SPECIAL_FROM = 151657  # tokenizer_config.json: <tool_call> onwards have "special": false


@pytest.fixture(scope="module")
def reference():
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    rank_file = str(qwen_rank_file())
    vocab, merges = TikTokenConverter(vocab_file=rank_file).extract_vocab_merges_from_model(
        rank_file
    )
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None)  # adds <|endoftext|> first
    tok.add_tokens(
        [
            AddedToken(t, special=FIRST_SPECIAL + i < NOT_SPECIAL_FROM, normalized=False)
            for i, t in enumerate(CONTROL_TOKENS)
        ]
    )
    tok.eos_token = "<|im_end|>"  # Qwen3 tokenizer_config.json
    tok.chat_template = TEMPLATE
    return tok


def test_control_tokens_sit_at_qwen3_ids(reference):
    tok = Qwen3Tokenizer()
    assert VOCAB_SIZE == 151669 and tok.vocab_size == 151669
    assert (tok.eos_id, tok.pad_id) == (IM_END_ID, ENDOFTEXT_ID) == (151645, 151643)
    expected = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<tool_response>": 151665,
        "</tool_response>": 151666,
        "<think>": 151667,
        "</think>": 151668,
    }
    for token, token_id in expected.items():
        assert tok.encode(token) == [token_id]
        assert reference.convert_tokens_to_ids(token) == token_id


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_transformers_qwen_tokenizer(reference, text):
    tok = Qwen3Tokenizer()
    ids = tok.encode(text)
    assert ids == reference.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == reference.decode(ids)


def test_digits_are_split_one_per_token():
    tok = Qwen3Tokenizer()
    assert [tok.decode([i]) for i in tok.encode("2048")] == ["2", "0", "4", "8"]


def test_decode_skips_ids_of_the_padded_model_vocabulary():
    tok = Qwen3Tokenizer()
    assert tok.decode([*tok.encode("ok"), 151700, 151935]) == "ok"


CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\na1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "obs"},
    ],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>r</think>a"}],
]


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("messages", CHATS)
def test_chat_template_equals_the_jinja_original(reference, messages, thinking):
    tok = Qwen3Tokenizer()
    generation = messages[-1]["role"] != "assistant"
    ours = tok.render_chat(messages, add_generation_prompt=generation, thinking=thinking)
    theirs = reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation, enable_thinking=thinking
    )
    assert ours == theirs


def test_thinking_off_closes_an_empty_think_block():
    tok = Qwen3Tokenizer()
    chat = [{"role": "user", "content": "q"}]
    off = tok.render_chat(chat, add_generation_prompt=True, thinking=False)
    on = tok.render_chat(chat, add_generation_prompt=True, thinking=True)
    assert on == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"


def test_checkpoint_directory_tokenizer_is_used_through_transformers(reference, tmp_path):
    reference.save_pretrained(tmp_path)
    tok = build_tokenizer(str(tmp_path))
    assert isinstance(tok, HFTokenizer)
    assert (tok.eos_id, tok.pad_id, tok.vocab_size) == (151645, 151643, 151669)
    builtin = Qwen3Tokenizer()
    for text in TEXTS:
        assert tok.encode(text) == builtin.encode(text)
    chat = CHATS[1]
    assert tok.render_chat(chat, add_generation_prompt=True, thinking=False) == builtin.render_chat(
        chat, add_generation_prompt=True, thinking=False
    )


def test_directory_without_tokenizer_files_falls_back_to_builtin_qwen3(tmp_path):
    assert isinstance(build_tokenizer(str(tmp_path)), Qwen3Tokenizer)
    assert isinstance(build_tokenizer(None), Qwen3Tokenizer)
