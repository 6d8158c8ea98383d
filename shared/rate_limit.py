"""A token bucket on a caller's clock, pure (no clock of its own): replication's
replicationRateByBytes and compaction's compactionRateByEntries / compactionRateByBytes.
It counts units of anything: bytes, or entries."""

from __future__ import annotations


class ByteRateLimiter:
    """A token bucket of `rate_bytes` a second on `now_ms` (Guava's RateLimiter, which
    BookKeeper's replicationRateByBytes uses): a send may go while the bucket is not in
    debt and spends its bytes, even more than are there (an entry larger than a second's
    worth must pass too); an idle second's worth is kept at most. `rate_bytes` -1: no
    limit. Over any span of T ms, at most rate x T / 1000 bytes plus one send's go out."""

    def __init__(self, rate_bytes: int, now_ms: int) -> None:
        assert rate_bytes == -1 or rate_bytes > 0
        self.rate_bytes = rate_bytes
        self._tokens = 0.0
        self._at_ms = now_ms

    def _refill(self, now_ms: int) -> None:
        if now_ms > self._at_ms:
            self._tokens = min(
                self._tokens + (now_ms - self._at_ms) * self.rate_bytes / 1000, self.rate_bytes
            )
            self._at_ms = now_ms

    def allows(self, now_ms: int) -> bool:
        if self.rate_bytes == -1:
            return True
        self._refill(now_ms)
        return self._tokens >= 0

    def spend(self, count: int, now_ms: int) -> None:
        if self.rate_bytes != -1:
            self._refill(now_ms)
            self._tokens -= count

    def wait_ms(self, now_ms: int) -> float:
        """How long until `allows` (0: now)."""
        if self.rate_bytes == -1:
            return 0.0
        self._refill(now_ms)
        return 0.0 if self._tokens >= 0 else -self._tokens * 1000 / self.rate_bytes
