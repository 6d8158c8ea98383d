"""The event publisher's pure parts: the retry backoff, the drop record, and what `emit`
does with a full buffer (no NATS needed: nothing is published until `start`)."""

from __future__ import annotations

from shared.events import Backoff, Drops, EventPublisher, EventStats
from shared.metrics import MetricsRegistry, events_metrics
from shared.subjects import Subjects


def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(0.1, 5.0)
    delays = [backoff.next() for _ in range(9)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    backoff.reset()
    assert backoff.next() == 0.1


def test_drops_report_counts_by_kind_and_the_seq_range() -> None:
    drops = Drops()
    for kind, seq in (("a", 4), ("b", 5), ("a", 9)):
        drops.add(kind, seq)
    assert drops.report() == {
        "dropped": 3,
        "by_kind": {"a": 2, "b": 1},
        "first_seq": 4,
        "last_seq": 9,
    }


def test_a_full_buffer_drops_the_newest_and_every_event_takes_a_seq() -> None:
    events = EventPublisher(None, Subjects("t"), "test-1.events", queue_size=2)  # type: ignore[arg-type]  # never published
    for kind in ("a", "b", "a", "c"):
        events.emit(kind)
    assert events.stats.buffered == 2
    assert events.stats.dropped_by_kind == {"a": 1, "c": 1}
    buffered = [event for event, _ in events._buffer]
    assert [(e.kind, e.seq, e.boot_id) for e in buffered] == [
        ("a", 1, events.boot_id),
        ("b", 2, events.boot_id),
    ]
    assert events._drops.report() == {
        "dropped": 2,
        "by_kind": {"a": 1, "c": 1},
        "first_seq": 3,
        "last_seq": 4,
    }


def test_the_metrics_of_a_fresh_publisher_are_there_and_zero() -> None:
    registry = MetricsRegistry()
    registry.add(events_metrics(EventStats()))
    scrape = registry.scrape()
    assert scrape.value("quire_events_published_total") == 0
    assert scrape.value("quire_events_publish_retries_total") == 0
    assert scrape.value("quire_events_buffered") == 0
    assert "quire_events_dropped" in scrape.types
