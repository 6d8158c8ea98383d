"""What every SLA table function is given besides the events."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TARGET_MS = 10.0
DEFAULT_WINDOW_S = 3600


@dataclass(frozen=True)
class SlaOptions:
    """The report's period and targets. Times are milliseconds since the epoch (UTC).

    The tables report what happened in [since_ms, until_ms) (an hour, an incident, an
    interval, a recovery... that starts in it); the events before `since_ms` are still read,
    because they say what the cluster held (ledgers, ensembles, entries) when the period
    began. `end_ms` is the end of the input: `until_ms` when given, else the last event's
    time; what is still open then (an interval, an exposure) is measured up to it.
    """

    end_ms: int
    since_ms: int | None = None
    until_ms: int | None = None
    target_ms: float = DEFAULT_TARGET_MS  # the add latency SLO target
    window_s: int = DEFAULT_WINDOW_S  # ack_latency's time bucket (an hour by default)

    def in_period(self, ts_ms: int) -> bool:
        return (self.since_ms is None or ts_ms >= self.since_ms) and (
            self.until_ms is None or ts_ms < self.until_ms
        )
