"""Cores are pure (STYLE.md rule 1): no asyncio, NATS, SQLAlchemy, clock or randomness."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"asyncio", "nats", "sqlalchemy", "time", "random", "aiofiles", "psycopg", "socket"}
PURE = [
    "shared/quorum.py",
    "shared/digest.py",
    "shared/wire.py",
    "shared/status.py",
    *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("services/*/core.py")),
]


@pytest.mark.parametrize("path", PURE)
def test_core_imports_nothing_impure(path: str) -> None:
    tree = ast.parse((ROOT / path).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN, f"{path} imports {sorted(imported & FORBIDDEN)}"
