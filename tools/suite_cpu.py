"""Where the test suite's CPU goes: every process it starts, by kind, in core-seconds.

    python tools/suite_cpu.py [--interval 0.5] [--json PATH] [-- <pytest arguments>]

Runs `python -m pytest <arguments>` (the README's command when none are given) and samples every
process of the machine from /proc each interval, keeping each one's user + system seconds from
when it was first seen to when it was last seen. `/usr/bin/time` (and the suite figures in
experiments/LOG.md before session 32) count only the processes pytest waits for; Ray's actors
and daemons are re-parented and left out, and so are the cores they take (session 32: 2,600
counted of about 3,500 used). This tool prints:

- the machine's busy core-seconds over the run (/proc/stat: everything, the suite's or not);
- the core-seconds of the processes that appeared during the run, by kind (xdist worker, co
  host, XLA-TPU compile child, Ray actor, Ray daemon, ...), and of those already running;
- what no sample saw (the machine's busy time less both): processes shorter than an interval.

A process's kind is read from its command line when first seen (`kind`). Standard library only.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")

# (substring of the command line, kind), first match wins
KINDS = [
    ("import sys;exec(eval(sys.stdin.readline()))", "pytest-xdist worker (in-process tests)"),
    ("-m pytest", "pytest (main process)"),
    ("locoexp.compiled.worker", "XLA-TPU compile child (dry_run=compile)"),
    ("multiprocessing.spawn", "co / single-controller host (spawned)"),
    ("ray/_private/workers/", "Ray actor (a da host)"),
    ("ray::", "Ray actor (a da host)"),
    ("gcs_server", "Ray daemon"),
    ("raylet", "Ray daemon"),
    ("ray/dashboard/", "Ray daemon"),
    ("log_monitor.py", "Ray daemon"),
    ("autoscaler/_private/monitor.py", "Ray daemon"),
    ("runtime_env", "Ray daemon"),
    ("ray/_private/", "Ray daemon"),
    ("placement/ray/watchdog.py", "Ray watchdog"),
    ("run.py", "python run.py (launcher or single process)"),
    ("/tests/", "test worker script (tests/*_worker.py)"),
    ("wandb", "W&B"),
]


def kind(cmdline: str) -> str:
    for needle, name in KINDS:
        if needle in cmdline:
            return name
    return "other: " + (Path(cmdline.split()[0]).name if cmdline.strip() else "(kernel thread)")


def machine_busy_ticks() -> int:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # less idle and iowait


class Sampler:
    """pid -> [cpu counted from (0 for a process started after the first sample), cpu when last
    seen, command line, seen in the first sample]."""

    def __init__(self, interval_s: float):
        self.interval_s, self.seen, self.stop = interval_s, {}, threading.Event()
        self._sample(first=True)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, first: bool = False) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / TICK
                if name in self.seen:
                    self.seen[name][1] = cpu
                else:
                    raw = Path(f"/proc/{name}/cmdline").read_bytes()
                    cmdline = raw.replace(b"\0", b" ").decode(errors="replace")
                    self.seen[name] = [cpu if first else 0.0, cpu, cmdline, first]
            except (OSError, IndexError, ValueError):  # gone between listing and reading
                continue

    def _run(self) -> None:
        while not self.stop.wait(self.interval_s):
            self._sample()

    def report(self) -> dict:
        new, old = collections.Counter(), 0.0
        count = collections.Counter()
        for first_cpu, last_cpu, cmdline, before in self.seen.values():
            if before:
                old += last_cpu - first_cpu
            else:
                new[kind(cmdline)] += last_cpu - first_cpu
                count[kind(cmdline)] += 1
        return {"by_kind": dict(new), "processes": dict(count), "already_running": old}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    args = parser.parse_args()
    busy0, start = machine_busy_ticks(), time.monotonic()
    sampler = Sampler(args.interval)
    sampler.thread.start()
    code = subprocess.call([sys.executable, "-m", "pytest", *args.pytest_args], cwd=REPO)
    sampler.stop.set()
    sampler.thread.join()
    sampler._sample()
    wall, busy = time.monotonic() - start, (machine_busy_ticks() - busy0) / TICK
    figures = sampler.report()
    seen = sum(figures["by_kind"].values()) + figures["already_running"]
    figures |= {"wall_s": wall, "machine_busy_core_s": busy, "unseen_core_s": busy - seen}
    figures["pytest_exit"] = code
    print(f"\npytest exit {code}; wall {wall:.1f} s on {os.cpu_count()} cores")
    print(f"machine busy: {busy:.1f} core-s ({busy / wall:.2f} cores on average)")
    print(f"{'core-s':>8} {'procs':>6}  processes started during the run, by kind")
    for name, seconds in sorted(figures["by_kind"].items(), key=lambda kv: -kv[1]):
        print(f"{seconds:8.1f} {figures['processes'][name]:6d}  {name}")
    print(f"{figures['already_running']:8.1f} {'':6}  processes already running at the start")
    print(f"{figures['unseen_core_s']:8.1f} {'':6}  unseen (processes shorter than an interval)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
