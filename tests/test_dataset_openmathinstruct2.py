"""OpenMathInstruct-2 through `datasets` on rows this test writes in the hub's schema
(problem, generated_solution, expected_answer, problem_source)."""

import json

import pytest
from dataset_options import completion, dataset_option

from locoexp.dataset.build import build_task

ROWS = [
    {
        "problem": "What is $3 \\cdot 4$?",
        "generated_solution": "$3 \\cdot 4 = \\boxed{12}$.",
        "expected_answer": "12",
        "problem_source": "augmented_math",
    },
    {
        "problem": "Simplify $\\frac{2}{4}$.",
        "generated_solution": "It is $\\boxed{\\frac{1}{2}}$.",
        "expected_answer": "\\frac{1}{2}",
        "problem_source": "augmented_math",
    },
    {
        "problem": "Solve $x^2 = 9$ for $x > 0$.",
        "generated_solution": "$x = \\boxed{3}$",
        "expected_answer": "3",
        "problem_source": "augmented_gsm8k",
    },
    {
        "problem": "Sum the numbers: " + " + ".join(["1"] * 900) + ".",
        "generated_solution": "\\boxed{900}",
        "expected_answer": "900",
        "problem_source": "math",
    },
]


@pytest.fixture
def files(tmp_path):
    path = tmp_path / "openmathinstruct2.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_scale_study_defaults():
    config = dataset_option("openmathinstruct2")
    assert (config.prompts_per_step, config.samples_per_prompt, config.max_new_tokens) == (
        256,
        8,
        8192,
    )
    assert config.path == "nvidia/OpenMathInstruct-2" and config.eval_split is None


def test_rows_in_the_hub_schema_load_and_long_prompts_are_dropped(files):
    task = build_task(dataset_option("openmathinstruct2", data_files=str(files)))
    assert [e.id for e in task.train] == [0, 1, 2] and task.long_prompts == 1
    assert [e.answer for e in task.train] == ["12", "\\frac{1}{2}", "3"]
    assert task.eval == []


def test_generated_solutions_score_one_and_wrong_answers_zero(files):
    task = build_task(dataset_option("openmathinstruct2", data_files=str(files)))
    solutions = [completion(task.tokenizer, r["generated_solution"]) for r in ROWS[:3]]
    assert task.score(task.train, solutions).tolist() == [1.0, 1.0, 1.0]
    equivalent = [completion(task.tokenizer, t) for t in ("12.0", "0.5", "x = 3")]
    assert task.score(task.train, equivalent).tolist() == [1.0, 1.0, 1.0]
    wrong = [
        completion(task.tokenizer, t)
        for t in ("\\boxed{13}", "\\boxed{\\frac{1}{3}}", "\\boxed{-3}")
    ]
    assert task.score(task.train, wrong).tolist() == [0.0, 0.0, 0.0]


def test_max_train_rows_takes_the_first_rows(files):
    task = build_task(dataset_option("openmathinstruct2", data_files=str(files), max_train_rows=2))
    assert [e.id for e in task.train] == [0, 1]
