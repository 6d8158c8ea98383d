"""gRPC `ReadBatches`: how a page of entries is split into messages."""

from __future__ import annotations

from services.gateway.grpc_api import split_by_bytes


def test_a_page_is_split_into_runs_of_bounded_payload_bytes() -> None:
    entries = [(0, b"a" * 4), (1, b"b" * 4), (2, b"c" * 9), (3, b"d"), (4, b"e" * 3)]
    runs = [[entry_id for entry_id, _ in run] for run in split_by_bytes(entries, 8)]
    assert runs == [[0, 1], [2], [3, 4]]  # the 9-byte entry alone, over the bound
    assert list(split_by_bytes([], 8)) == []
