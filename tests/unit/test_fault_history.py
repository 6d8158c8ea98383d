"""The fault suite's history (quire/faults/history.py): records in order, from many threads,
written as JSON lines as they come and read back the same."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from quire.faults.checker import calls
from quire.faults.history import History, load


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with History(path) as history:
        create = history.invoke("w0", "create", None, {"ensemble_size": 3, "password": "pw"})
        history.ok(create, {"ledger_id": 7})
        append = history.invoke("w0", "append", 7, {"payloads": [b"\x00\xffa", b"b"]})
        history.ok(append, {"first": 0, "last": 1, "lac": 1})
        read = history.invoke("r0", "read", 7, {"from": 0, "to": None, "unconfirmed": False})
        history.fail(read, {"code": "TIMEOUT", "entries": [[0, b"\x00\xffa", 1]]})
        pending = history.invoke("w0", "append", 7, {"payloads": [b"c"]})
        ops = history.ops()
    assert load(path) == ops
    assert [op.type for op in ops] == ["invoke", "ok", "invoke", "ok", "invoke", "fail", "invoke"]
    assert ops[2].value["payloads"] == [b"\x00\xffa", b"b"]
    assert ops[5].value["entries"] == [[0, b"\x00\xffa", 1]]
    assert [op.index for op in ops] == list(range(7))
    assert [c.outcome for c in calls(ops)] == ["ok", "ok", "fail", "info"]
    assert ops[-1].op_id == pending


def test_a_line_cut_by_a_crash_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with History(path) as history:
        history.ok(history.invoke("w0", "close", 1), {"last_entry_id": 3})
    whole = path.read_text()
    path.write_text(whole + whole.splitlines()[0][:20])
    assert len(load(path)) == 2


def test_one_completion_each() -> None:
    history = History()
    op_id = history.invoke("w0", "recover", 1)
    assert [op.op_id for op in history.open_ops()] == [op_id]
    history.info(op_id, {"code": "TIMEOUT"})
    assert history.open_ops() == []
    with pytest.raises(ValueError, match="not open"):
        history.ok(op_id)
    with pytest.raises(ValueError, match="not open"):
        history.fail(99)


def test_threads_record_in_one_order() -> None:
    history = History()

    def work(name: str) -> None:
        for _ in range(200):
            history.ok(history.invoke(name, "lac", 1), {"lac": 0})

    threads = [threading.Thread(target=work, args=(f"r{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ops = history.ops()
    assert [op.index for op in ops] == list(range(1600))
    assert len({op.op_id for op in ops}) == 800
    assert all(c.completion is not None for c in calls(ops))
    times = [op.time_s for op in ops]
    assert times == sorted(times)
