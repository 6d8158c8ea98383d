"""The limits every API surface (HTTP, gRPC) applies to appends, in one place."""

from __future__ import annotations

from collections.abc import Sequence

from shared.config import GatewaySettings
from shared.status import ApiCodes, QuireError


def check_batch_size(count: int, settings: GatewaySettings) -> None:
    if count < 1:
        raise QuireError(ApiCodes.INVALID_ARGUMENT, "an append needs at least one entry")
    if count > settings.max_batch_entries:
        raise QuireError(
            ApiCodes.INVALID_ARGUMENT,
            f"{count} entries exceed the batch limit of {settings.max_batch_entries}",
        )


def check_entry_size(size: int, settings: GatewaySettings, what: str = "the entry") -> None:
    if size > settings.max_entry_size_bytes:
        raise QuireError(
            ApiCodes.ENTRY_TOO_LARGE,
            f"{what} is {size} bytes, more than {settings.max_entry_size_bytes}",
        )


def check_payloads(payloads: Sequence[bytes], settings: GatewaySettings) -> None:
    """A batch is refused whole if any entry breaks a limit: nothing is appended."""
    check_batch_size(len(payloads), settings)
    for index, payload in enumerate(payloads):
        check_entry_size(len(payload), settings, f"entries[{index}]")
