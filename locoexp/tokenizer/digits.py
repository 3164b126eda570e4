"""The synthetic task's character-level tokenizer: pad, bos, eos, '=', then one id per digit.

`locoexp.dataset.synthetic` builds its prompts from these ids; `locoexp.tokenizer.files` writes
the same vocabulary as Hugging Face tokenizer files beside an exported policy.
"""

import dataclasses
from collections.abc import Sequence

PAD, BOS, EOS, SEP, DIGIT0 = 0, 1, 2, 3, 4


@dataclasses.dataclass(frozen=True)
class DigitTokenizer:
    """Character-level tokenizer: pad, bos, eos, '=', then one token per digit symbol."""

    num_symbols: int = 10
    pad_id: int = PAD
    eos_id: int = EOS

    @property
    def vocab_size(self) -> int:
        return DIGIT0 + self.num_symbols

    def encode(self, text: str) -> list[int]:
        specials = {"=": SEP}
        return [
            specials[ch] if ch in specials else DIGIT0 + int(ch) for ch in text if not ch.isspace()
        ]

    def decode(self, ids: Sequence[int]) -> str:
        names = {PAD: "<pad>", BOS: "<bos>", EOS: "<eos>", SEP: "="}
        return "".join(names.get(int(i), str(int(i) - DIGIT0)) for i in ids)
