"""The auditor's Prometheus metrics (docs/metrics.md, auditor): its counters and state,
under Quire's names and BookKeeper's (AutoRecoveryMain's `auditor_` scope), read at scrape
time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.auditor.periodic import BOOKIE_CHECK, CHECK_ALL, PLACEMENT_CHECK, REPLICAS_CHECK
from shared.metrics import Builder, Exposition
from shared.models import BookieState

if TYPE_CHECKING:
    from services.auditor.service import Auditor

# BookKeeper's OpStatsLogger of each periodic check (ReplicationStats).
CHECK_TIMES = {
    BOOKIE_CHECK: "auditor_AUDIT_BOOKIES_TIME",
    CHECK_ALL: "auditor_CHECK_ALL_LEDGERS_TIME",
    REPLICAS_CHECK: "auditor_REPLICAS_CHECK_TIME",
    PLACEMENT_CHECK: "auditor_PLACEMENT_POLICY_CHECK_TIME",
}


def auditor_metrics(auditor: Auditor) -> Builder:
    def build(e: Exposition) -> None:
        periodic = auditor.periodic
        e.bk_counter(
            "auditor_election_attempts",
            "Attempts to win the auditor election",
            auditor.election_attempts,
        )
        e.bk_counter(
            "auditor_NUM_LEDGERS_CHECKED",
            "Ledgers read by the check-all-ledgers and replicas checks",
            periodic.ledgers_checked,
        )
        for check, stats in periodic.durations.items():
            e.op_stats(
                stats,
                bk_name=CHECK_TIMES[check],
                quire_name="quire_auditor_check_duration_seconds",
                doc="Periodic check runs",
                check=check,
            )
        e.gauge(
            "auditor_NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY",
            "Ledgers with a segment failing the placement policy, as of the last check",
            periodic.ledgers_not_adhering,
        )
        e.gauge(
            "auditor_NUM_LEDGERS_SOFTLY_ADHERING_TO_PLACEMENT_POLICY",
            "Ledgers meeting the placement policy only softly, as of the last check",
            periodic.ledgers_softly_adhering,
        )
        e.gauge(
            "quire_auditor_ledgers_not_adhering",
            "Ledgers by placement adherence below strict, as of the last placement check",
            periodic.ledgers_not_adhering,
            adherence="fail",
        )
        e.gauge(
            "quire_auditor_ledgers_not_adhering",
            "Ledgers by placement adherence below strict, as of the last placement check",
            periodic.ledgers_softly_adhering,
            adherence="soft",
        )
        e.gauge("quire_auditor_leader", "1 while this auditor is elected", int(auditor.is_leader))
        e.counter(
            "quire_auditor_election_attempts",
            "Attempts to win the auditor election",
            auditor.election_attempts,
        )
        e.counter("quire_auditor_audits", "Audits of the bookie registry", auditor.audits)
        marked = "Ledgers marked under-replicated"
        e.declare_counter("quire_auditor_ledgers_marked", marked, "reason")
        for reason, n in list(auditor.marks_by_reason.items()):
            e.counter("quire_auditor_ledgers_marked", marked, n, reason=reason)
        e.counter(
            "quire_auditor_ledgers_checked",
            "Ledgers read by the check-all-ledgers and replicas checks",
            periodic.ledgers_checked,
        )
        e.counter("quire_auditor_commands", "Operator commands carried out", auditor.commands)
        e.counter(
            "quire_auditor_entry_corrupt_events",
            "entry.corrupt events consumed",
            auditor.corrupt_events,
        )
        e.counter(
            "quire_auditor_malformed_events",
            "Events that could not be decoded",
            auditor.malformed_events,
        )
        e.gauge(
            "quire_auditor_lost_bookies_waiting",
            "Lost bookies within their lostBookieRecoveryDelay",
            len(auditor.lost.waiting),
        )
        states = list(auditor.known.values())
        for state in BookieState:
            e.gauge(
                "quire_auditor_bookies",
                "Bookies by state, as last seen",
                states.count(state),
                state=state.value,
            )
        e.gauge(
            "quire_auditor_pending_cookie_removals",
            "Bookies whose cookie removal waits for their ledgers' repair",
            len(auditor.pending_cookie_removals),
        )

    return build
