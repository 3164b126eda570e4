"""Admission as the paper measures it (Section 4.3, Figure 7a, App. C Eq. 3), on this CPU.

Real GSM8K rows, the real Qwen3 tokenizer, Table 1's 128 prompts x 16 samples per step. Each arm
admits the same steps' requests with `locoexp.dataset.admission.admit_requests` (chat template,
tokenization, prompt cap and submission to a request queue, one request at a time):
- the single controller: one process admits all P x G requests;
- `co` at H hosts: H processes start together (a barrier) and each admits its own P x G / H
  requests (its share from `split_across_hosts`, as the step does), in parallel;
and Eq. 3 is fitted per stack, d_adm = alpha0 + alpha1 * n, from three request counts
(P = 32, 64, 128 at G = 16; for `co`, n is the host's own share). Each figure is the median over
`--steps` steps after one warm-up step; `--pretokenized` adds the `opt.pretokenize_prompts` arm.

    python tools/bench_admission.py [--steps 5] [--hosts 2 4] [--json out.json]

CPU figures: the host processes share this machine's cores (and other jobs'); not TPU figures.
"""

import argparse
import json
import multiprocessing
import statistics
from pathlib import Path

import numpy as np

from locoexp.dataset.admission import admit_requests
from locoexp.dataset.build import build_task
from locoexp.dataset.config import DatasetConfig, DatasetKind
from locoexp.dataset.schedule import PromptSchedule
from locoexp.placement.phases import split_across_hosts
from locoexp.rollout.requests import RequestQueue

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
GROUP = 16
PROMPT_COUNTS = (32, 64, 128)


def gsm8k_config() -> DatasetConfig:
    """conf/dataset/gsm8k.yaml's Table 1 settings over the local training file."""
    return DatasetConfig(
        kind=DatasetKind.gsm8k,
        data_files=str(DATA / "train.jsonl"),
        max_prompt_tokens=512,
        max_new_tokens=2048,
        prompts_per_step=128,
        samples_per_prompt=GROUP,
    )


def admit_steps(task, prompts: int, host: int, hosts: int, steps: int, pretokenized: bool):
    """Seconds of this host's admission at each of `steps` + 1 steps (the first is warm-up)."""
    schedule = PromptSchedule(len(task.train), prompts, seed=0, batches_per_pass=None, passes=1)
    seconds = []
    for step in range(steps + 1):
        indices = schedule.batch(step)
        lengths = np.array([len(task.train[i].prompt_tokens) for i in indices])
        mine = split_across_hosts(indices, lengths, hosts, balance=False)[host]
        queue = RequestQueue()
        record = admit_requests(
            task,
            [task.train[i] for i in mine],
            group_size=GROUP,
            queue=queue,
            pretokenized=pretokenized,
        )
        assert len(queue.drain()) == record.requests == len(mine) * GROUP
        seconds.append(record.seconds)
    return seconds[1:]


def host_process(host, hosts, prompts, steps, pretokenized, barrier, results):
    task = build_task(gsm8k_config())
    barrier.wait()  # every host has loaded its task: admission starts together
    results[host] = admit_steps(task, prompts, host, hosts, steps, pretokenized)


def co_hosts(prompts: int, hosts: int, steps: int, pretokenized: bool) -> list[list[float]]:
    """Per host, its admission seconds per step, admitted by `hosts` processes at once."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        barrier, results = manager.Barrier(hosts), manager.dict()
        processes = [
            context.Process(
                target=host_process,
                args=(h, hosts, prompts, steps, pretokenized, barrier, results),
            )
            for h in range(hosts)
        ]
        for p in processes:
            p.start()
        for p in processes:
            p.join()
            if p.exitcode != 0:
                raise RuntimeError(f"admission host process exited with {p.exitcode}")
        return [list(results[h]) for h in range(hosts)]


def fit_eq3(requests: list[int], seconds: list[float]) -> dict[str, float]:
    """Least-squares alpha0 + alpha1 * n (App. C Eq. 3) over (n, d_adm) pairs."""
    alpha1, alpha0 = np.polyfit(np.asarray(requests, float), np.asarray(seconds, float), 1)
    return {"alpha0_s": float(alpha0), "alpha1_ms_per_request": float(alpha1 * 1e3)}


def measure(steps: int, hosts_list: list[int], pretokenized: bool) -> dict:
    task = build_task(gsm8k_config())
    single = {}
    for prompts in PROMPT_COUNTS:
        single[prompts * GROUP] = statistics.median(
            admit_steps(task, prompts, 0, 1, steps, pretokenized)
        )
    co = {}
    for hosts in hosts_list:
        for prompts in PROMPT_COUNTS:
            per_host = co_hosts(prompts, hosts, steps, pretokenized)
            co[(hosts, prompts * GROUP)] = {
                "per_host_s": [statistics.median(s) for s in per_host],
                "slowest_host_s": statistics.median([max(s) for s in zip(*per_host, strict=True)]),
                "requests_per_host": prompts * GROUP // hosts,
            }
    co_pairs = [(v["requests_per_host"], t) for v in co.values() for t in v["per_host_s"]]
    return {
        "pretokenized": pretokenized,
        "single_controller_s": single,
        "single_controller_fit": fit_eq3(list(single), list(single.values())),
        "co": {f"{h} hosts, {n} requests": v for (h, n), v in co.items()},
        "co_fit": fit_eq3([n for n, _ in co_pairs], [t for _, t in co_pairs]),
    }


def report(result: dict) -> None:
    mode = "pre-tokenised" if result["pretokenized"] else "per-request tokenization (paper)"
    print(f"[CPU] admission, {mode}, GSM8K, Qwen3 tokenizer, G = {GROUP}:")
    for n, s in result["single_controller_s"].items():
        print(f"  single controller, {n:5d} requests in one process: {s * 1e3:8.1f} ms")
    for name, v in result["co"].items():
        hosts = ", ".join(f"{t * 1e3:.1f}" for t in v["per_host_s"])
        print(
            f"  co, {name}: {v['requests_per_host']} per host, per host [{hosts}] ms, "
            f"slowest host {v['slowest_host_s'] * 1e3:.1f} ms"
        )
    for stack in ("single_controller", "co"):
        fit = result[f"{stack}_fit"]
        print(
            f"  Eq. 3 fit, {stack}: alpha0 = {fit['alpha0_s'] * 1e3:.2f} ms, "
            f"alpha1 = {fit['alpha1_ms_per_request'] * 1e3:.1f} us per request"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--pretokenized", action="store_true", help="also the lever's arm")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = [measure(args.steps, args.hosts, pretokenized=False)]
    report(results[0])
    if args.pretokenized:
        results.append(measure(args.steps, args.hosts, pretokenized=True))
        report(results[1])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
