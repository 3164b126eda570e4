"""Math answer rewards: GSM8K `#### N` golds, `\\boxed{}` golds of NuminaMath-CoT, and the
`expected_answer` of OpenMathInstruct-2, checked with `math-verify`.

A response scores 1 when the answer it states is mathematically equal to the gold (`1,000` =
`1000`, `\\frac{1}{2}` = `0.5` = `1/2`, boxed or not), else 0. In thinking mode only the text
after the last `</think>` is graded, and a response still inside `<think>` (cut at the response
cap) scores 0. math-verify turns LaTeX into sympy expressions; nothing is run as code.
"""

import functools
import re
import threading

_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3})((?:,\d{3})+)(?![\d,])")


def extract_last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; linear time."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    open_at = text.find("{", start)
    if open_at < 0:
        return None
    depth, i = 0, open_at
    while i < len(text):
        if text[i] == "\\":  # an escaped brace (`\\{`, `\\}`) does not open or close a group
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1 : i]
        i += 1
    return None


def gsm8k_gold(solution: str) -> str:
    """GSM8K's final answer: the text after the last `####`, thousands separators removed."""
    if "####" not in solution:
        raise ValueError("GSM8K solution has no '#### <answer>' line")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def final_response(text: str) -> str | None:
    """The graded part of a response: after the last `</think>`; None while still thinking."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    return None if "<think>" in text else text


def _timeout() -> int | None:
    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    return 5 if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=65536)
def _parse_gold(gold: str):
    from math_verify import parse

    return parse(f"\\boxed{{{gold}}}", parsing_timeout=_timeout())


def math_reward(gold: str, response: str) -> float:
    """1.0 when `response` states an answer equal to `gold` (a LaTeX or plain answer), else 0.0."""
    from math_verify import parse, verify

    text = final_response(response)
    if text is None or not text.strip():
        return 0.0
    # "1,000" is one number in a math answer, not a tuple: drop thousands separators first.
    text = _THOUSANDS.sub(lambda m: m.group(1) + m.group(2).replace(",", ""), text)
    target = _parse_gold(gold)
    predicted = parse(text, parsing_timeout=_timeout())
    if not target or not predicted:
        return 0.0
    return float(verify(target, predicted, timeout_seconds=_timeout()))
