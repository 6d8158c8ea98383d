"""The classic cases as scripted runs: no chance faults, only what the script does (message
delays still come from the seed). Their transcripts are golden files under
tests/scenarios/; `python -m quire.sim --scenario NAME` prints one."""

from __future__ import annotations

from quire.sim.model import SimConfig


def _scenario(seed: int, **kwargs) -> SimConfig:
    base = {
        "seed": seed,
        "bookies": 4,
        "ensemble_size": 3,
        "write_quorum": 3,
        "ack_quorum": 2,
        "entries": 12,
        "duration_ms": 300,
        "settle_ms": 300,
        "recoveries": 1,
        "readers": 0,
        "random_faults": False,
    }
    return SimConfig(**{**base, **kwargs})


SCENARIOS: dict[str, SimConfig] = {
    # The writer goes on adding (a zombie) after a recovery fenced the ledger: its adds are
    # refused with FENCED, and the recovery closes at or after its last acknowledged entry.
    "basic_fencing": _scenario(1, script=((150, "recover", 0),)),
    # Five recoveries at once: they all return the same last entry.
    "parallel_recoveries": _scenario(
        2, recoveries=5, script=tuple((150 + i, "recover", i) for i in range(5))
    ),
    # One bookie of the ensemble is dead (never comes back): fencing and reading need only
    # Qw - Qa + 1 answers per write set, so the recovery completes without it.
    "recovery_with_dead_bookie": _scenario(
        3, script=((145, "crash", ("ensemble:1", -1)), (150, "recover", 0))
    ),
    # A bookie answers slowly (partitioned from the recovery for a while): the recovery
    # retries and completes.
    "recovery_with_slow_bookie": _scenario(
        4, script=((150, "partition", ("recovery0", "ensemble:2", 120)), (150, "recover", 0))
    ),
    # A bookie of the ensemble crashes while the writer writes: a new segment from LAC + 1,
    # the pending adds resent to the replacement, then a clean close.
    "ensemble_change_during_writes": _scenario(
        5,
        bookies=5,
        recoveries=0,
        script=((80, "crash", ("ensemble:0", 1000)), (280, "close", None)),
    ),
    # The writer's close and a recovery race: one of them wins the CAS, the other agrees.
    "close_racing_recovery": _scenario(6, script=((200, "close", None), (200, "recover", 0))),
    # A bookie restarts in the middle of a recovery (losing what it had not synced, its
    # ledgerstore unsure for a while): UNKNOWN never counts as "no such entry".
    "bookie_restart_during_recovery": _scenario(
        7, script=((150, "recover", 0), (153, "crash", ("ensemble:1", 20)))
    ),
    # A bookie of the ensemble is lost for good while the writer writes; the auditor marks
    # the ledger. Its only segment is open: after the grace period the replicator fences
    # and recovers the ledger (the writer's ensemble change races it; the writer is fenced),
    # then copies the closed segment's fragment to a spare. Nothing acknowledged is lost and
    # no segment names the lost bookie.
    "lost_bookie_rereplicated": _scenario(
        37,
        bookies=5,
        recoveries=0,
        entries=20,
        duration_ms=600,
        lose_bookie=True,
        open_ledger_grace_ms=100,
    ),
}
