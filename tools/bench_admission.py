"""Admission as the paper measures it (Section 4.3, Figure 7a, App. C Eq. 3), on this CPU.

Real GSM8K rows, the real Qwen3 tokenizer, Table 1's 128 prompts x 16 samples per step. Each arm
admits the same steps' requests with `locoexp.placement.admission.admit_requests` (chat template,
tokenization, prompt cap and submission to a request queue, one request at a time):
- the single controller: one process admits all P x G requests;
- `co` at H hosts: H processes start together (a barrier) and each admits its own P x G / H
  requests (its share from `split_across_hosts`, as the step does), in parallel;
and Eq. 3 is fitted per stack, d_adm = alpha0 + alpha1 * n, from three request counts
(P = 32, 64, 128 at G = 16; for `co`, n is the host's own share). Each figure is the median over
`--steps` steps after one warm-up step, arms interleaved step by step; both wall time (what a
step waits for) and the admitting thread's CPU time (the work, apart from waiting for a core) are
reported. `--pretokenized` adds the `opt.pretokenize_prompts` arm.

    python tools/bench_admission.py [--steps 5] [--hosts 2 4] [--json out.json]

CPU figures: the host processes share this machine's cores (and other jobs'); not TPU figures.
"""

import argparse
import json
import multiprocessing
import statistics
from pathlib import Path

import numpy as np

from locoexp.analysis.accounting import fit_admission
from locoexp.dataset.build import build_task
from locoexp.dataset.config import DatasetConfig, DatasetKind
from locoexp.dataset.schedule import PromptSchedule
from locoexp.placement.admission import admit_requests
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


def admit_step(task, prompts: int, step: int, host: int, hosts: int, pretokenized: bool):
    """(wall s, CPU s) of this host's admission of batch `step` with `prompts` prompts."""
    schedule = PromptSchedule(len(task.train), prompts, seed=0, batches_per_pass=None, passes=1)
    indices = schedule.batch(step)
    lengths = np.array([len(task.train[i].prompt_tokens) for i in indices])
    mine = split_across_hosts(indices, lengths, hosts, balance=False)[host]
    queue = RequestQueue()
    _, record = admit_requests(
        task,
        [task.train[i] for i in mine],
        group_size=GROUP,
        queue=queue,
        pretokenized=pretokenized,
    )
    assert len(queue.drain()) == record.requests == len(mine) * GROUP
    return record.seconds, record.cpu_seconds


def host_process(host, barriers, commands, results):
    """A `co` host: loads the task once, then admits its share whenever told to, starting
    together with the other hosts of that configuration (a barrier)."""
    task = build_task(gsm8k_config())
    results.put(("ready", host))
    while (command := commands.get()) is not None:
        hosts, prompts, step, pretokenized = command
        barriers[hosts].wait()
        results.put((host, admit_step(task, prompts, step, host, hosts, pretokenized)))


class CoHosts:
    """`max(hosts)` persistent host processes; `admit` runs one step on the first `hosts`."""

    def __init__(self, host_counts: list[int]):
        context = multiprocessing.get_context("spawn")
        self.size = max(host_counts)
        barriers = {h: context.Barrier(h) for h in host_counts}
        self.commands = [context.Queue() for _ in range(self.size)]
        self.results = context.Queue()
        self.processes = [
            context.Process(target=host_process, args=(h, barriers, self.commands[h], self.results))
            for h in range(self.size)
        ]
        for process in self.processes:
            process.start()
        for _ in range(self.size):
            self.results.get()  # every host has loaded its task

    def admit(self, hosts: int, prompts: int, step: int, pretokenized: bool) -> list[tuple]:
        for h in range(hosts):
            self.commands[h].put((hosts, prompts, step, pretokenized))
        done = dict(self.results.get() for _ in range(hosts))
        return [done[h] for h in range(hosts)]

    def close(self) -> None:
        for queue in self.commands:
            queue.put(None)
        for process in self.processes:
            process.join()


def fit_eq3(requests: list[int], seconds: list[float]) -> dict[str, float]:
    """App. C Eq. 3's alpha0 + alpha1 * n (`accounting.fit_admission`), in ms and us."""
    alpha0, alpha1 = fit_admission(requests, seconds)
    return {"alpha0_ms": alpha0 * 1e3, "alpha1_us_per_request": alpha1 * 1e6}


def measure(steps: int, host_counts: list[int], pretokenized: bool) -> dict:
    """Arms interleaved step by step: the single controller here, then each co host count."""
    task, hosts = build_task(gsm8k_config()), CoHosts(host_counts)
    raw = {}  # (arm, requests) -> per step: [(wall, cpu) per host]
    try:
        for step in range(steps + 1):  # step 0 warms up
            for prompts in PROMPT_COUNTS:
                n = prompts * GROUP
                timed = [admit_step(task, prompts, step, 0, 1, pretokenized)]
                raw.setdefault(("single_controller", n), []).append(timed)
                for h in host_counts:
                    timed = hosts.admit(h, prompts, step, pretokenized)
                    raw.setdefault((f"co{h}", n), []).append(timed)
    finally:
        hosts.close()
    return summarize(raw, host_counts, pretokenized)


def summarize(raw: dict, host_counts: list[int], pretokenized: bool) -> dict:
    """Medians over steps 1.. of the slowest host's wall and CPU seconds, and Eq. 3 fits."""
    arms, fits = {}, {}
    for (arm, n), steps in raw.items():
        steps = steps[1:]
        arms.setdefault(arm, {})[n] = {
            "requests_per_host": n // len(steps[0]),
            "wall_s": statistics.median(max(w for w, _ in hosts) for hosts in steps),
            "cpu_s": statistics.median(max(c for _, c in hosts) for hosts in steps),
        }
    for arm, rows in arms.items():
        per_host = [row["requests_per_host"] for row in rows.values()]
        fits[arm] = {
            clock: fit_eq3(per_host, [row[f"{clock}_s"] for row in rows.values()])
            for clock in ("wall", "cpu")
        }
    return {"pretokenized": pretokenized, "arms": arms, "eq3_fits": fits}


def report(result: dict) -> None:
    mode = "pre-tokenised" if result["pretokenized"] else "per-request tokenization (paper)"
    print(f"[CPU, loaded] admission, {mode}, GSM8K rows, Qwen3 tokenizer, G = {GROUP}:")
    for arm, rows in result["arms"].items():
        for n, row in rows.items():
            print(
                f"  {arm:>17}, {n:5d} requests, {row['requests_per_host']:5d} per host: slowest "
                f"host {row['wall_s'] * 1e3:7.1f} ms wall, {row['cpu_s'] * 1e3:7.1f} ms CPU"
            )
    for arm, fit in result["eq3_fits"].items():
        shown = "; ".join(
            f"{clock}: alpha0 {f['alpha0_ms']:.2f} ms, alpha1 {f['alpha1_us_per_request']:.1f} us"
            for clock, f in fit.items()
        )
        print(f"  Eq. 3 fit {arm} (n = requests per host): {shown}", flush=True)


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
