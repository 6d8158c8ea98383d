"""The output of the storage benchmarks (`python -m services.journal.bench`, `...scale_bench`,
and the ledgerstore's): their figures as JSON on stdout, and in a file when asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(result: dict[str, Any], json_path: str | None) -> None:
    text = json.dumps(result, indent=2)
    print(text)
    if json_path:
        Path(json_path).write_text(text + "\n")
