"""Cores are pure (STYLE.md rule 1): no asyncio, NATS, SQLAlchemy, clock or randomness."""

import ast

import pytest

from tests.support.layout import CORES, ROOT

FORBIDDEN = {"asyncio", "nats", "sqlalchemy", "time", "random", "aiofiles", "psycopg", "socket"}


@pytest.mark.parametrize("path", CORES)
def test_core_imports_nothing_impure(path: str) -> None:
    tree = ast.parse((ROOT / path).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN, f"{path} imports {sorted(imported & FORBIDDEN)}"
