"""STYLE.md rule 7, enforced: ruff (lint and format) on everything, mypy on the pure cores."""

import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.support.layout import CORES, ROOT

BIN = Path(sysconfig.get_path("scripts"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_lint() -> None:
    done = run(str(BIN / "ruff"), "check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format() -> None:
    done = run(str(BIN / "ruff"), "format", "--check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_on_the_cores() -> None:
    done = run(sys.executable, "-m", "mypy", *CORES)
    assert done.returncode == 0, done.stdout + done.stderr
