"""STYLE.md rule 7, enforced: ruff (lint and format) on everything, mypy on the pure cores,
and the house rules (services independent, shared and quire import no service, pure cores
import no IO, clock or randomness) as import-linter contracts (.importlinter)."""

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


def test_import_contracts() -> None:
    done = run(str(BIN / "lint-imports"), "--no-cache")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_on_the_cores() -> None:
    done = run(sys.executable, "-m", "mypy", *CORES)
    assert done.returncode == 0, done.stdout + done.stderr


def test_generated_grpc_code_matches_the_proto(tmp_path: Path) -> None:
    done = run(
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-Iproto",
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        "proto/quire/v1/ledgers.proto",
    )
    assert done.returncode == 0, done.stderr
    for name in ("ledgers_pb2.py", "ledgers_pb2.pyi", "ledgers_pb2_grpc.py"):
        generated = (tmp_path / "quire" / "v1" / name).read_text()
        assert generated == (ROOT / "quire" / "v1" / name).read_text(), f"run `make proto`: {name}"
