"""Rewards on hand-written cases: math answers through math-verify, SWE-agent commands as text."""

import numpy as np
import pytest

from locoexp.reward.math import extract_last_boxed, final_response, gsm8k_gold, math_reward
from locoexp.reward.scorer import RewardKind, RewardScorer
from locoexp.reward.swe import extract_command, swe_action_reward


@pytest.mark.parametrize(
    ("gold", "response"),
    [
        ("1000", "The total is \\boxed{1,000}."),
        ("1000", "So she pays 1,000 dollars."),
        ("1000", "#### 1000"),
        ("0.5", "\\boxed{\\frac{1}{2}}"),
        ("\\frac{1}{2}", "the answer is 1/2"),
        ("\\frac{\\sqrt{3}}{2}", "$\\boxed{\\frac{\\sqrt3}{2}}$"),
        ("x^2+1", "\\boxed{1+x^2}"),
        ("3", "\\boxed{3.0}"),
        ("18", "It costs $18"),
        ("72", "<think>\nhalf of 48 is 24\n</think>\n\n\\boxed{72}"),
    ],
)
def test_equivalent_forms_score_one(gold, response):
    assert math_reward(gold, response) == 1.0


@pytest.mark.parametrize(
    ("gold", "response"),
    [
        ("72", "\\boxed{73}"),
        ("72", "It is 72. Check: 5"),  # the last stated number is the answer
        ("72", "<think>\nthe answer is 72"),  # still thinking at the response cap
        ("72", ""),
        ("1000", "\\boxed{100}"),
        ("\\frac{1}{2}", "\\boxed{\\frac{1}{3}}"),
    ],
)
def test_wrong_or_unfinished_answers_score_zero(gold, response):
    assert math_reward(gold, response) == 0.0


def test_model_output_is_not_run_as_code():
    response = "\\boxed{__import__('os').system('touch /tmp/locoexp_pwned')}"
    assert math_reward("0", response) == 0.0
    assert swe_action_reward("```\nls\n```", "```\nrm -rf /tmp/locoexp_x\n```") == 0.0


def test_gold_extraction():
    assert gsm8k_gold("She has 3 + 4 = <<3+4=7>>7\n#### 1,200") == "1200"
    assert extract_last_boxed("a \\boxed{1} then \\boxed{\\frac{a}{b}} end") == "\\frac{a}{b}"
    assert extract_last_boxed("\\boxed{\\left\\{x\\right\\}}") == "\\left\\{x\\right\\}"
    assert extract_last_boxed("no box") is None and extract_last_boxed("\\boxed{open") is None
    assert final_response("<think>a</think>b") == "b" and final_response("<think>a") is None


def test_swe_command_extraction_and_partial_credit():
    reference = "Let's open it.\n\n```\nopen src/app.py 40\n```"
    assert extract_command(reference) == "open src/app.py 40"
    assert swe_action_reward(reference, "Open.\n```bash\nopen   src/app.py  40\n```") == 1.0
    assert swe_action_reward(reference, "```\nopen src/other.py\n```") == 0.5
    assert swe_action_reward(reference, "```\nsearch_dir foo\n```") == 0.0
    assert swe_action_reward(reference, "open src/app.py 40") == 0.0  # no fenced command


def test_process_pool_gives_the_same_rewards():
    golds = ["12", "\\frac{1}{2}", "7", "100"] * 4
    responses = ["\\boxed{12}", "0.5", "\\boxed{8}", "1,00"] * 4
    pooled = RewardScorer(RewardKind.math, workers=2)
    try:
        np.testing.assert_array_equal(
            pooled(golds, responses), RewardScorer(RewardKind.math, workers=0)(golds, responses)
        )
    finally:
        pooled.close()
