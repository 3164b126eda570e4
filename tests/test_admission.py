"""Admission as the paper defines it (Section 4.3): every request rendered, tokenized and
submitted one at a time, on real GSM8K rows with the real Qwen3 tokenizer; pre-tokenised
admission (`opt.pretokenize_prompts`) submits the load-time tokens instead."""

import os

import numpy as np
import pytest
from dataset_options import dataset_option, shared_data

from locoexp.dataset.build import build_task
from locoexp.dataset.config import DatasetConfig
from locoexp.placement.admission import admit_requests
from locoexp.rollout.requests import RequestQueue


@pytest.fixture(scope="module")
def gsm8k():
    folder = shared_data("gsm8k")
    config = dataset_option(
        "gsm8k", data_files=str(folder / "train.jsonl"), max_train_rows=64, eval_data_files=None
    )
    return build_task(config)


class CountingTask:
    """Wraps a task and counts `encode_prompt` calls (the per-request tokenization)."""

    def __init__(self, task):
        self.task, self.calls = task, 0

    def encode_prompt(self, example):
        self.calls += 1
        return self.task.encode_prompt(example)


@pytest.mark.parametrize("pretokenized", [False, True])
def test_every_request_is_submitted_in_group_order_with_the_load_time_tokens(gsm8k, pretokenized):
    examples, queue = list(gsm8k.train[:8]), RequestQueue()
    counting = CountingTask(gsm8k)
    prompts, record = admit_requests(
        counting, examples, group_size=4, queue=queue, pretokenized=pretokenized
    )
    requests = queue.drain()
    assert all(p is r.prompt_tokens for p, r in zip(prompts, requests, strict=True))
    assert len(queue) == 0 and record.requests == len(requests) == 32
    assert [(r.example_id, r.sample) for r in requests] == [
        (e.id, g) for e in examples for g in range(4)
    ]
    for request in requests:
        expected = next(e for e in examples if e.id == request.example_id).prompt_tokens
        np.testing.assert_array_equal(request.prompt_tokens, expected)
    # The paper's admission tokenizes every request; pre-tokenised admission none.
    assert counting.calls == (0 if pretokenized else 32)
    assert record.pretokenized is pretokenized and record.metrics()["admission/pretokenized"] == (
        1.0 if pretokenized else 0.0
    )


def test_admission_is_serial_in_the_calling_process(gsm8k):
    queue = RequestQueue()
    _, record = admit_requests(
        gsm8k, list(gsm8k.train[:16]), group_size=8, queue=queue, pretokenized=False
    )
    stamps = [r.submitted_ns for r in queue.drain()]
    assert record.pid == os.getpid()
    assert stamps == sorted(stamps)  # one at a time, in order
    assert (record.first_submitted_ns, record.last_submitted_ns) == (stamps[0], stamps[-1])
    assert record.seconds > 0


def test_rendered_request_is_the_chat_template_over_the_row(gsm8k):
    example = gsm8k.train[0]
    text = gsm8k.tokenizer.decode(gsm8k.encode_prompt(example))
    assert example.messages[0]["content"].startswith("Natalia sold clips")
    assert text.startswith("<|im_start|>user\nNatalia sold clips")
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_truncated_long_prompts_are_truncated_again_at_admission(gsm8k):
    folder = shared_data("gsm8k")
    config = dataset_option(
        "gsm8k",
        data_files=str(folder / "train.jsonl"),
        max_train_rows=16,
        eval_data_files=None,
        max_prompt_tokens=40,
        long_prompts="truncate",
    )
    task = build_task(config)
    assert task.long_prompts > 0
    for example in task.train:
        np.testing.assert_array_equal(task.encode_prompt(example), example.prompt_tokens)


def test_synthetic_requests_are_tokenized_from_text():
    task = build_task(DatasetConfig())
    queue = RequestQueue()
    admit_requests(task, list(task.train[:5]), group_size=3, queue=queue, pretokenized=False)
    for request in queue.drain():
        expected = task.train[request.example_id].prompt_tokens
        np.testing.assert_array_equal(request.prompt_tokens, expected)


def test_admission_log_round_trip(tmp_path, gsm8k):
    from locoexp.placement.admission import AdmissionLog, read_admission_logs

    log = AdmissionLog(tmp_path / "admission" / "host1.jsonl")
    for step in range(2):
        _, record = admit_requests(
            gsm8k, list(gsm8k.train[:2]), group_size=2, queue=RequestQueue(), pretokenized=False
        )
        log.write(step, record)
    logs = read_admission_logs(tmp_path)
    assert list(logs) == ["host1"] and [r["step"] for r in logs["host1"]] == [0, 1]
    assert logs["host1"][1]["requests"] == 4 and logs["host1"][1]["pid"] == os.getpid()


def test_the_rendezvous_meets_after_the_first_request_and_refuses_a_host_left_alone(tmp_path):
    from support.rendezvous import AdmissionRendezvous

    task = build_task(DatasetConfig())
    examples = list(task.train[:2])
    (tmp_path / "started-1-0").touch()  # the other host has started its first admission
    host0 = AdmissionRendezvous(folder=tmp_path, host=0, hosts=2, deadline_s=0.05)
    queue = RequestQueue()
    admit_requests(
        task, examples, group_size=2, queue=queue, pretokenized=False, on_first_request=host0.meet
    )
    assert (tmp_path / "started-0-0").exists() and len(queue) == 4
    queue.drain()
    # Its second admission: host 1 never starts one (serial admission), so host 0 fails the run.
    with pytest.raises(RuntimeError, match="admission is not parallel"):
        admit_requests(
            task,
            examples,
            group_size=2,
            queue=queue,
            pretokenized=False,
            on_first_request=host0.meet,
        )
