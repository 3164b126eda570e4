"""Tests whose check needs several CPU devices run a worker script in a subprocess (XLA's device
count is fixed before jax starts) and compare the arrays it wrote."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parent


def worker_results(script: str, folder: Path) -> dict[str, np.ndarray]:
    """Run tests/`script` with an .npz path in `folder`; the arrays it saved there."""
    path = folder / "results.npz"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    subprocess.run(
        [sys.executable, str(TESTS / script), str(path)], env=env, check=True, timeout=900
    )
    return dict(np.load(path))
