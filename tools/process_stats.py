"""This process's clocks and memory, and the machine's load: the figures every benchmark reports
beside its own (standard library only, so tools run in other virtualenvs can import it too)."""

import os
import resource
from pathlib import Path


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc; includes interpreter start and imports)."""
    start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KB on Linux


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (against wall time: the cores it really got)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def load_averages() -> str:
    return "load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
