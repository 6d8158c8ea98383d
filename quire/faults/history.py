"""The fault suite's history: every operation the workload makes, recorded as an invoke
and then exactly one of ok, fail or info (quire/faults/checker.py says what each means).

Thread-safe: one lock orders the records, so a record's index is real-time order across
every thread that records (an `ok` recorded before an `invoke` completed before it began).
Each record is also written as a JSON line to the history file as it is made (flushed, not
fsynced: a run that crashes keeps what the page cache holds), and `load` reads it back.
Bytes in values are written as {"$b64": "..."}."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from quire.faults.checker import FAIL, INFO, INVOKE, OK, Op

BYTES_KEY = "$b64"


def _encode(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {BYTES_KEY: base64.b64encode(value).decode()}
    if isinstance(value, Mapping):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {BYTES_KEY}:
            return base64.b64decode(value[BYTES_KEY])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def to_line(op: Op) -> str:
    record = {
        "index": op.index,
        "op_id": op.op_id,
        "type": op.type,
        "process": op.process,
        "kind": op.kind,
        "ledger": op.ledger,
        "value": _encode(op.value),
        "time_s": op.time_s,
    }
    return json.dumps(record, separators=(",", ":"))


def from_line(line: str) -> Op:
    record = json.loads(line)
    return Op(
        index=record["index"],
        op_id=record["op_id"],
        type=record["type"],
        process=record["process"],
        kind=record["kind"],
        ledger=record["ledger"],
        value=_decode(record["value"]),
        time_s=record["time_s"],
    )


def load(path: Path) -> list[Op]:
    """A history file read back. A last line cut short by a crash is left out."""
    ops = []
    with path.open() as lines:
        for line in lines:
            if not line.endswith("\n"):
                break
            ops.append(from_line(line))
    return ops


class History:
    """Records operations; `path` (optional) is the JSON-lines file written as it goes."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._ops: list[Op] = []
        self._open: dict[int, Op] = {}  # op id -> its invoke, until it completes
        self._next_id = 0
        self._started = time.monotonic()
        self._file: IO[str] | None = path.open("a") if path is not None else None

    def invoke(
        self, process: str, kind: str, ledger: int | None, value: Mapping[str, Any] | None = None
    ) -> int:
        """Record that `process` begins an operation; its id, for the completion."""
        with self._lock:
            op_id = self._next_id
            self._next_id += 1
            op = self._record(op_id, INVOKE, process, kind, ledger, value)
            self._open[op_id] = op
            return op_id

    def ok(self, op_id: int, value: Mapping[str, Any] | None = None) -> None:
        self.complete(op_id, OK, value)

    def fail(self, op_id: int, value: Mapping[str, Any] | None = None) -> None:
        self.complete(op_id, FAIL, value)

    def info(self, op_id: int, value: Mapping[str, Any] | None = None) -> None:
        self.complete(op_id, INFO, value)

    def complete(self, op_id: int, type_: str, value: Mapping[str, Any] | None = None) -> None:
        """Record the one completion of operation `op_id` (a second one is a bug)."""
        assert type_ in (OK, FAIL, INFO), type_
        with self._lock:
            invoke = self._open.pop(op_id, None)
            if invoke is None:
                raise ValueError(f"operation {op_id} is not open (unknown or completed)")
            self._record(op_id, type_, invoke.process, invoke.kind, invoke.ledger, value)

    def _record(
        self,
        op_id: int,
        type_: str,
        process: str,
        kind: str,
        ledger: int | None,
        value: Mapping[str, Any] | None,
    ) -> Op:
        op = Op(
            index=len(self._ops),
            op_id=op_id,
            type=type_,
            process=process,
            kind=kind,
            ledger=ledger,
            value=dict(value or {}),
            time_s=round(time.monotonic() - self._started, 6),
        )
        self._ops.append(op)
        if self._file is not None:
            self._file.write(to_line(op) + "\n")
            self._file.flush()
        return op

    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def open_ops(self) -> list[Op]:
        """The invokes not completed yet."""
        with self._lock:
            return list(self._open.values())

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
