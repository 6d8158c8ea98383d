"""Every SLA table's oracle by the table's name (analytics.sla.job.TABLES' names)."""

from tests.support.sla_oracle import (
    availability,
    completeness,
    ensembles,
    exposure,
    gc,
    latency,
    recoveries,
)

ORACLES = {
    "ack_latency": latency.ack_latency,
    "recoveries": recoveries.recoveries,
    "ensemble_changes": ensembles.ensemble_changes,
    "bookie_availability": availability.bookie_availability,
    "completeness": completeness.completeness,
    "exposure": exposure.exposure,
    "exposure_timeline": exposure.exposure_timeline,
    "gc_reclaim": gc.gc_reclaim,
}
