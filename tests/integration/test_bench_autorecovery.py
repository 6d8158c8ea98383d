"""`quire bench autorecovery` against a cluster that fails it early: the error says what
failed (the bench's own clean-up must not hide it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quire.bench.autorecovery import AutorecoverySpec, run_autorecovery
from quire.bench.targets import Quorum
from shared.config import QuireSettings
from shared.metaclient import MetadataError
from shared.models import MetaErrorCode


async def test_a_failure_before_the_foreground_writer_starts_is_the_error(
    settings: QuireSettings, tmp_path: Path
) -> None:
    # NATS without a metadata service: creating the first ledger fails at once.
    spec = AutorecoverySpec(ledgers=1, entries=1, open_ledgers=0, timeout_s=5.0)
    with pytest.raises(MetadataError) as failed:
        await run_autorecovery(settings, Quorum(3, 3, 2), spec, [], lambda _: None, tmp_path)
    assert failed.value.code is MetaErrorCode.UNAVAILABLE
