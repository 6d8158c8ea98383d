"""Every setting of every Quire service, in one pydantic-settings tree.

Environment variables are `QUIRE_<FIELD>` for top-level fields and
`QUIRE_<SECTION>__<FIELD>` for nested ones, e.g. `QUIRE_JOURNAL__MAX_GROUP_WAIT_MS=1`.
Each field names the BookKeeper setting it mirrors where there is one, so that an
operator who tuned BookKeeper finds the same lever here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.protocol.flow import DEFAULT_MAX_ADD_REQUESTS_PER_BOOKIE
from shared.protocol.placement import DEFAULT_LOCATION, PlacementRules, parse_location

MIB = 1024 * 1024


class JournalSettings(BaseModel):
    # journalMaxGroupWaitMSec: the longest an add waits for its group commit.
    max_group_wait_ms: float = Field(default=2.0, ge=0, le=1000)
    # journalBufferedWritesThreshold: commit as soon as this many bytes are pending.
    buffered_writes_threshold_bytes: int = Field(default=512 * 1024, ge=1)
    # journalBufferedEntriesThreshold: commit as soon as this many entries are pending.
    buffered_entries_threshold: int = Field(default=4096, ge=1)
    # journalFlushWhenQueueEmpty: commit as soon as the writer has taken everything
    # pending, without waiting max_group_wait_ms for more (batches still form while the
    # previous fsync runs). Off: wait for a threshold or max_group_wait_ms.
    flush_when_queue_empty: bool = True
    # journalSyncData: fsync before acknowledging. Off means a machine crash can lose
    # acknowledged entries; a process crash cannot (the data is in the page cache).
    sync_data: bool = True
    # journalRemovePagesFromCache: after a group commit's fsync, drop the page cache of the
    # journal file except its last 4 MiB (which the ledgerstore is about to read). Fresh
    # page-cache pages are expensive to write (30-50x on a VM); recycled ones are not.
    remove_pages_from_cache: bool = True
    # journalQueueSize: adds waiting for the journal writer; beyond it, TOO_MANY_REQUESTS.
    queue_size: int = Field(default=10_000, ge=1)
    # maxAddsInProgressLimit: add requests admitted and waiting for their group commit at
    # once; beyond it the journal takes no more from its subscription until one is
    # answered (the next requests wait there). BookKeeper's default is unlimited.
    max_adds_in_progress_limit: int = Field(default=1024, ge=1)
    # journalMaxSizeMB: roll to a new journal file past this size.
    max_size_mb: int = Field(default=256, ge=1)
    # journalMaxBackups: journal files wholly before the LastLogMark kept as backups
    # (never replayed; `quire shell readjournal` reads them).
    max_backups: int = Field(default=5, ge=0)
    # skipReplayJournalInvalidRecord: a bad record before the journal's tail normally
    # stops the bookie from starting. On: log it, skip to the next valid group commit and
    # start (the skipped records are lost; absent entries answer UNKNOWN_LEDGER_STATE).
    skip_replay_journal_invalid_record: bool = False
    # journalDirectories: where the journals live, one journal per directory (each its own
    # writer thread, group commit and fsync; a ledger's records go to journal
    # ledger_id % count). BookKeeper's advice is a device of its own for the journal: an
    # add waits on the journal's fdatasync, and on a disk shared with the entry logs and
    # the index that fsync queues behind their flushes; several devices, several journals
    # fsyncing at once. Same path rules as ledgerstore.ledger_directories (relative: under
    # the bookie's dir; absolute: the bookie id appended). JSON list in the environment:
    # '["/mnt/journal1","/mnt/journal2"]'. The cookie records them: keep the order.
    journal_directories: list[str] = Field(default=["journal"], min_length=1)


class LedgerstoreSettings(BaseModel):
    # logSizeLimit: roll to a new entry log file past this size.
    log_size_limit_bytes: int = Field(default=512 * MIB, ge=4096)
    # flushInterval: how often the ledgerstore checkpoints (fsyncs entry logs and index,
    # then moves the journal's LastLogMark).
    flush_interval_ms: int = Field(default=1000, ge=10)
    # After each flush, drop the page cache of what was written to the entry logs (reads
    # of flushed entries then come from the disk, in read-ahead batches), for the same
    # reason as journal.remove_pages_from_cache.
    remove_pages_from_cache: bool = True
    # ... or sooner, once this many entry bytes wait in the write cache: a flush of
    # megabytes at once stalled the journals' fsyncs on the same disk for tens of ms.
    flush_threshold_bytes: int = Field(default=MIB, ge=4096)
    # How often it looks at the journal for new records when no notification came.
    journal_poll_interval_ms: int = Field(default=200, ge=1)
    # The journal tells the ledgerstore what it committed at most once per this interval
    # (0: after every group commit), and the ledgerstore then applies it all at once. Not
    # on the add path (the journal answers adds); a read of an entry not applied yet
    # catches up at once.
    journal_apply_interval_ms: float = Field(default=20.0, ge=0, le=10_000)
    # Co-hosted bookie (bookie_process=cohosted): the journal's durable group commits
    # handed to the ledgerstore in process wait in a queue of at most this many; one
    # offered when it is full is dropped and read from the journal file instead.
    journal_handoff_queue_batches: int = Field(default=1024, ge=1)
    # ledgerDirectories: where entry logs live; a ledger's entries go to directory
    # (ledger id modulo their count). Relative paths are under the bookie's dir; absolute
    # ones get the bookie id appended (so that every bookie of `quire up` has its own).
    # The index lives in the first. JSON list in the environment: '["ledgers","/mnt/d2"]'.
    ledger_directories: list[str] = Field(default=["ledgers"], min_length=1)
    # dbStorage_writeCacheMaxSizeMb: entries applied but not yet flushed to entry logs;
    # when full, the ledgerstore flushes before applying more.
    write_cache_max_size_bytes: int = Field(default=64 * MIB, ge=4096)
    # dbStorage_readAheadCacheMaxSizeMb: entries read from entry logs kept in memory.
    read_ahead_cache_max_size_bytes: int = Field(default=64 * MIB, ge=0)
    # dbStorage_readAheadCacheBatchSize: the most entries of a ledger read ahead on a
    # read-cache miss. A request is read ahead by as many entries as it asked (what its
    # reader asks next), up to this.
    read_ahead_cache_batch_size: int = Field(default=100, ge=1, le=10_000)
    # numReadWorkerThreads: read requests served at once; each has at most one blocking
    # call (index queries, entry log reads) on the ledgerstore's read threads, as many as
    # this and apart from the threads of the journal catch-up and the flush. One by
    # default: a read thread's work is mostly Python (index rows, frame checks) under the
    # GIL, so more threads read no faster on one bookie but take turns at the GIL with
    # the event loop, and in a co-hosted bookie that loop answers adds: with 4, the loop
    # waited p50 0.2-0.3 ms / p99 3 ms per hand-over beside cold reads, with 1 p50 0.05 /
    # p99 1-1.8 ms, and the reads went ~30 % faster at ~30 % less CPU per entry
    # (docs/performance.md, "Issue 20: reads beside writes, the fix"). More helps only
    # where preads wait on a slow disk.
    num_read_worker_threads: int = Field(default=1, ge=1, le=64)
    # Write priority: while the journal is making adds durable (a group commit handed or
    # reported since the last read served), a read worker pauses after each request so
    # that serving reads takes at most this share of its time: a request that took 2 ms
    # is followed by an 18 ms pause at 0.1 (at most READ_PAUSE_MAX_S). Reads still
    # progress (never less than this share); with no writes they go at full speed.
    # 1: no pause. Counted in quire_ledgerstore_read_paused_seconds.
    read_share_while_writing: float = Field(default=0.1, gt=0, le=1)
    # maxPendingReadRequestsPerThread: read requests waiting for a worker, per worker;
    # beyond, a request is answered TOO_MANY_REQUESTS at once. 4 x 1,000 requests of 100
    # entries are seconds of reading (docs/storage.md has the rates): only an overload
    # queues that many. A request that waited past its sender's timeout (it carries it)
    # is dropped unread whatever the length.
    max_pending_read_requests_per_thread: int = Field(default=1_000, ge=1)
    # diskUsageThreshold: above this used fraction of a bookie disk, the bookie turns
    # read-only (adds get READ_ONLY; reads go on).
    disk_usage_threshold: float = Field(default=0.95, gt=0, le=1)
    # diskUsageLwmThreshold: a read-only bookie turns writable again below this.
    disk_usage_lwm_threshold: float = Field(default=0.90, gt=0, le=1)
    # diskCheckInterval: how often disk usage is checked.
    disk_check_interval_ms: int = Field(default=10_000, ge=10)
    # minUsableSizeForHighPriorityWrites: a read-only bookie still takes recovery adds (the
    # replicator's and a ledger recovery's: high-priority writes) while every disk has this
    # much free. BookKeeper's default: 1.2 x the entry log size limit.
    min_usable_size_for_high_priority_writes_bytes: int = Field(default=int(1.2 * 512 * MIB), ge=0)

    # -- garbage collection and compaction (BookKeeper's GarbageCollectorThread) --
    # gcWaitTime: how often the garbage collector compares this bookie's ledgers with the
    # metadata store's and deletes what metadata no longer has. BookKeeper's default is 1 s
    # and Pulsar ships 15 min; a scan lists every ledger id range of the cluster, so once
    # a minute.
    gc_wait_time_ms: int = Field(default=60_000, ge=100)
    # verifyMetadataOnGc: before deleting a ledger missing from the listing, read its
    # metadata and delete only on an explicit "no such ledger". BookKeeper's default is
    # off; ours is on: one metadata read per deleted ledger buys the safety rule against a
    # listing that is partial or stale.
    verify_metadata_on_gc: bool = True
    # minorCompactionThreshold / minorCompactionInterval: entry logs with less than this
    # fraction of live bytes are compacted this often (0 threshold or interval: disabled).
    minor_compaction_threshold: float = Field(default=0.2, ge=0, le=1)
    minor_compaction_interval_ms: int = Field(default=3_600_000, ge=0)
    # majorCompactionThreshold / majorCompactionInterval: the same, less often, for logs
    # with more live data.
    major_compaction_threshold: float = Field(default=0.8, ge=0, le=1)
    major_compaction_interval_ms: int = Field(default=86_400_000, ge=0)
    # minorCompactionMaxTimeMillis / majorCompactionMaxTimeMillis: a compaction run stops
    # starting new logs after this long (-1: no limit).
    minor_compaction_max_time_ms: int = Field(default=-1, ge=-1)
    major_compaction_max_time_ms: int = Field(default=-1, ge=-1)
    # compactionRateByEntries / compactionRateByBytes / isThrottleByBytes: how fast
    # compaction copies live entries (a second), by entries unless throttling by bytes.
    compaction_rate_by_entries: int = Field(default=1_000, ge=1)
    compaction_rate_by_bytes: int = Field(default=1_000_000, ge=1)
    is_throttle_by_bytes: bool = False
    # isForceGCAllowWhenNoSpace: a bookie read-only for a full disk runs forced garbage
    # collection and compaction to become writable again (else compaction is suspended
    # while the disk is full, as it needs room to write the compacted logs).
    is_force_gc_allow_when_no_space: bool = False

    @model_validator(mode="after")
    def _check_disk_thresholds(self) -> LedgerstoreSettings:
        if self.disk_usage_lwm_threshold > self.disk_usage_threshold:
            raise ValueError("disk_usage_lwm_threshold must not exceed disk_usage_threshold")
        if 0 < self.major_compaction_threshold <= self.minor_compaction_threshold:
            raise ValueError("major_compaction_threshold must exceed minor_compaction_threshold")
        return self


class MetadataSettings(BaseModel):
    # How long a bookie stays registered without a heartbeat (ZooKeeper's session timeout).
    bookie_lease_ms: int = Field(default=10_000, ge=100)
    # How often bookies renew their lease.
    bookie_heartbeat_ms: int = Field(default=2_000, ge=50)
    # Requests served at once by one metadata instance.
    max_in_flight: int = Field(default=64, ge=1)
    # PostgreSQL connections per metadata instance.
    db_pool_size: int = Field(default=8, ge=1)
    # Group commit: ledger creates (with a sequence id) and ledger compare-and-sets that
    # queue while earlier ones are written go to PostgreSQL together, at most this many in
    # one statement (one WAL flush), with at most `db_batches_in_flight` such statements of
    # each kind at once. 1 and 1: every change alone, one at a time.
    db_batch_max: int = Field(default=64, ge=1, le=1024)
    db_batches_in_flight: int = Field(default=2, ge=1)
    # The outbox publisher: most changes published per batch, and how often the leading
    # instance looks for changes other instances committed (its own wake it at once).
    outbox_batch_size: int = Field(default=256, ge=1, le=4096)
    outbox_poll_interval_ms: int = Field(default=20, ge=1)
    # The auditor's leadership lease (its renewals come every third of it): a dead
    # auditor is replaced within about this long.
    auditor_lease_ms: int = Field(default=6_000, ge=300)


class AuditorSettings(BaseModel):
    """The auditor's knobs: BookKeeper's names (`auditorPeriodic...` in snake_case, in
    seconds as BookKeeper's), and BookKeeper's defaults except where noted.
    lostBookieRecoveryDelay is not here: it is the stored cluster setting
    (ClusterSettings.lost_bookie_recovery_delay_s), which the auditor reads at each look."""

    # auditorPeriodicBookieCheckInterval: how often the leader marks every ledger naming a
    # bookie that is not registered alive (also once on election). 0: only on election.
    auditor_periodic_bookie_check_interval_s: int = Field(default=86_400, ge=0)
    # auditorPeriodicCheckInterval: check-all-ledgers (first and last entry of each
    # fragment on its bookie, plus auditor_ledger_verification_percentage). 0: off.
    auditor_periodic_check_interval_s: int = Field(default=604_800, ge=0)
    # auditorLedgerVerificationPercentage: of the entries between a fragment's first and
    # last, the share check-all-ledgers reads too.
    auditor_ledger_verification_percentage: int = Field(default=0, ge=0, le=100)
    # auditorPeriodicReplicasCheckInterval: every entry on every replica, digest checked.
    # 0: off (BookKeeper's default).
    auditor_periodic_replicas_check_interval_s: int = Field(default=0, ge=0)
    # auditorPeriodicPlacementPolicyCheckInterval: segments with fewer distinct bookies
    # than the ensemble size or naming an unregistered bookie. 0: off (BookKeeper's).
    auditor_periodic_placement_policy_check_interval_s: int = Field(default=0, ge=0)
    # repairedPlacementPolicyNotAdheringBookieEnable: also mark such ledgers (reason
    # placement), naming the repeated or unregistered bookies. Off: only reported.
    repaired_placement_policy_not_adhering_bookie_enable: bool = False
    # How often the leader looks at the bookie registry for lost bookies. BookKeeper is told
    # by a ZooKeeper watch; here the registry is polled.
    auditor_bookie_registry_poll_interval_ms: int = Field(default=1_000, ge=10)
    # How often the leader looks whether the ledgers a limbo, recovered or decommissioned
    # bookie held were all repaired (to clear its limbo or remove its cookie): each look
    # reads the under-replication queue or every ledger.
    auditor_repair_wait_check_interval_ms: int = Field(default=5_000, ge=10)
    # auditorMaxNumberOfConcurrentOpenLedgerOperations: ledgers checked at once. BookKeeper's
    # default is 500; 8 here, as a local cluster's bookies share a few cores with the
    # foreground traffic the checks must not starve.
    auditor_max_number_of_concurrent_open_ledger_operations: int = Field(default=8, ge=1)
    # A check's reads of one bookie: entries per request, and how long one may take
    # (BookKeeper's readTimeout, 5 s) before that bookie counts as unreachable.
    auditor_read_batch_entries: int = Field(default=64, ge=1, le=4096)
    auditor_read_timeout_ms: int = Field(default=5_000, ge=10)


class GatewaySettings(BaseModel):
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=7480, ge=0, le=65535)
    grpc_port: int = Field(default=7481, ge=0, le=65535)
    # How clients reach this gateway from outside (its own address, not a load balancer's):
    # recorded in each ledger it creates as the ledger's writer, where other gateways
    # redirect that ledger's appends and close. None: from the bound host and ports
    # (the host name when bound to every interface).
    advertised_http_url: str | None = None  # e.g. "http://gw-1.example:7480"
    advertised_grpc: str | None = None  # host:port, e.g. "gw-1.example:7481"
    # TLS for HTTP and gRPC: both files set turns it on (PEM certificate chain and key).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # nettyMaxFrameSizeBytes' role: the largest entry a client may append.
    max_entry_size_bytes: int = Field(default=5 * MIB, ge=1)
    # The most entries one batch append may carry.
    max_batch_entries: int = Field(default=10_000, ge=1)
    # The most bytes one append request body may carry (a JSON batch is base64): 413 beyond.
    max_batch_bytes: int = Field(default=64 * MIB, ge=1)
    # addEntryQuorumTimeoutSec: an add not acknowledged by then fails with TIMEOUT.
    add_entry_timeout_ms: int = Field(default=10_000, ge=10)
    # addEntryTimeoutSec: a bookie that has not answered an add by then has failed and is
    # replaced by an ensemble change (the add itself goes on).
    add_bookie_timeout_ms: int = Field(default=5_000, ge=10)
    # "No responders" from a bookie that registered at least this long ago is a failed
    # request at once (the bookie is gone: its replacement starts at the first failed write);
    # from one that registered more recently it is asked again briefly (its subscriptions may
    # not be known everywhere yet). Registration times: `shared.models.REGISTERED_AT`.
    new_bookie_grace_ms: int = Field(default=5_000, ge=0)
    # An add request unanswered this long makes the client ask whether its bookie still has
    # a responder (one probe at a time per bookie); if not, the adds in flight to it fail
    # at once and its writers replace it, instead of waiting add_bookie_timeout_ms (a bookie
    # killed with requests in flight never answers them). 0: never ask.
    add_bookie_probe_ms: int = Field(default=50, ge=0)
    # speculativeReadTimeout: a replica slower than this to answer a read gets the next
    # replica asked too (the first good answer wins); 0 turns speculative reads off.
    speculative_read_timeout_ms: int = Field(default=500, ge=0)
    # explicitLacInterval: an idle writer sends its LAC to the bookies after this long, so
    # that readers on other gateways see its last entry; 0 turns it off.
    explicit_lac_interval_ms: int = Field(default=1_000, ge=0)
    # A recovery (fence, find the last entry, close) that takes longer fails with TIMEOUT
    # and leaves the ledger IN_RECOVERY for the next recovery to finish.
    recovery_timeout_ms: int = Field(default=30_000, ge=100)
    # How long a recovery waits before asking again the bookies that gave no usable answer.
    recovery_retry_interval_ms: int = Field(default=200, ge=1)
    # recoveryReadBatchSize: entries a recovery reads at once past the LAC (one batched read
    # per bookie); 1 reads them one by one.
    recovery_read_batch_size: int = Field(default=64, ge=1, le=1024)
    # readEntryTimeoutSec: a bookie read not answered by then has failed; its bookie backs
    # off and the entry is retried (shared/protocol/reader.py). A read request carries at
    # most read_batch_entries entries, so this times a bookie's progress, not a range's size.
    read_entry_timeout_ms: int = Field(default=2_000, ge=10)
    # The most entries in one read request to a bookie.
    read_batch_entries: int = Field(default=64, ge=1, le=4096)
    # Entries asked of one bookie and unanswered, per read (a window, as TCP's congestion
    # window): it starts here, grows while the bookie answers in less than half of
    # speculative_read_timeout_ms, eases off while it answers slower than all of it (the
    # entries queue there), and halves on a timeout or a TOO_MANY_REQUESTS.
    read_window_initial_entries: int = Field(default=16, ge=1)
    read_window_max_entries: int = Field(default=512, ge=1)
    # readAheadMaxEntries (DistributedLog's): a read asks no entry further than this past
    # the next one its consumer has not taken; it bounds the reorder buffer (and the memory
    # of a read of any size) and stops the asking when the consumer stops taking.
    read_ahead_max_entries: int = Field(default=4_096, ge=1)
    # stickyReadsEnabled, in blocks: runs of this many entries are asked of one bookie (its
    # read-ahead serves contiguous entries), the next block of the next bookie.
    sticky_read_block_entries: int = Field(default=256, ge=1)
    # The retry budget (gRPC's retry throttling): a speculative read or a retry on another
    # replica after a timeout or TOO_MANY_REQUESTS costs a token; each entry read at the
    # first ask earns this ratio of one, up to the max. Without a token the entry waits for
    # the same bookie's backoff: a busy cluster is not made busier by its readers.
    read_retry_budget_max_tokens: float = Field(default=64.0, ge=0)
    read_retry_budget_token_ratio: float = Field(default=0.1, ge=0)
    # A bookie that timed out or answered TOO_MANY_REQUESTS gets nothing more of a read for
    # this long, doubling on each further one up to the max (reset by a good answer).
    read_backoff_initial_ms: int = Field(default=50, ge=1)
    read_backoff_max_ms: int = Field(default=2_000, ge=1)
    # An entry fails with TIMEOUT or TOO_MANY_REQUESTS after this many rounds over its
    # replicas that each ended so (with the defaults, at worst 3 x Qw tries of 2 s each).
    read_max_tries: int = Field(default=3, ge=1)
    # The longest a LAC long poll may wait.
    long_poll_max_timeout_ms: int = Field(default=60_000, ge=0)
    # An HTTP request not answered by then gets 504 TIMEOUT (a long poll gets its own
    # timeout_ms plus this much).
    request_timeout_ms: int = Field(default=30_000, ge=100)
    # Requests one client (bearer token, else address) may have in flight; beyond, 429.
    max_requests_in_flight_per_client: int = Field(default=1024, ge=1)
    # Adds in flight per ledger before appends wait (back-pressure).
    max_pending_adds_per_ledger: int = Field(default=10_000, ge=1)
    # Add requests unanswered per bookie, per writer and for the whole client (every
    # ledger's sends merged); what comes meanwhile goes out together when an answer comes
    # (batches form as load grows).
    max_add_requests_per_bookie: int = Field(
        default=DEFAULT_MAX_ADD_REQUESTS_PER_BOOKIE, ge=1, le=1024
    )
    # /readyz answers 200 only once this many writable bookies are registered.
    ready_min_writable_bookies: int = Field(default=1, ge=0)


class ReplicatorSettings(BaseModel):
    """The replication workers' settings (BookKeeper's ReplicationWorker ones, in snake_case)."""

    # Replication workers per replicator process; each works on one ledger at a time.
    num_workers: int = Field(default=1, ge=1, le=64)
    # The lease of a worker's claim on an under-replicated ledger (BookKeeper's ZooKeeper
    # lock lives as long as the worker's session, zkTimeout 10 s): renewed every third of it
    # while the worker works; a worker that dies leaves the ledger to others once it lapses.
    underreplicated_lease_ms: int = Field(default=10_000, ge=300, le=3_600_000)
    # openLedgerRereplicationGracePeriod: an OPEN ledger whose last segment has a marked
    # bookie is fenced and recovered only once this long has passed since it was marked;
    # until then its writer may still replace the bookie by an ensemble change itself.
    open_ledger_rereplication_grace_period_ms: int = Field(default=30_000, ge=0, le=3_600_000)
    # rereplicationEntryBatchSize: entries in one add request to the replacement bookie (4
    # requests unanswered at once, so a worker holds at most 4x this many entries read and
    # not yet stored). BookKeeper's 10 costs little on its per-bookie channels; here each
    # request is a NATS round trip. Copying 12,000 1 KB entries on this project's VM: 10 ->
    # 5-8 MB/s, 32 -> 14-16, 64 -> 17-20, 128 -> 18-20.
    rereplication_entry_batch_size: int = Field(default=64, ge=1, le=4096)
    # replicationRateByBytes: entry frame bytes one worker copies a second; -1: unthrottled.
    replication_rate_by_bytes: int = Field(default=-1, ge=-1)
    # lockReleaseOfFailedLedgerGracePeriod: a ledger this worker failed to replicate stays
    # claimed (no worker gets it) for a backoff that doubles with each failure, from 1/32 of
    # this up to all of it, then its claim lapses and any worker may try again.
    lock_release_of_failed_ledger_grace_period_ms: int = Field(
        default=300_000, ge=100, le=3_600_000
    )
    # rwRereplicateBackoffMs: how long a worker waits after the queue or the metadata
    # service failed it (unavailable, a malformed answer) before asking again.
    rw_rereplicate_backoff_ms: int = Field(default=5_000, ge=10, le=600_000)
    # How often an idle worker asks the queue for a ledger (a worker that just finished
    # one asks again at once). One request a second per worker is no load on the metadata
    # service and starts a repair within a second of the mark.
    claim_poll_interval_ms: int = Field(default=1_000, ge=10, le=600_000)

    @model_validator(mode="after")
    def _check_rate(self) -> ReplicatorSettings:
        if self.replication_rate_by_bytes == 0:
            raise ValueError("replication_rate_by_bytes must be positive, or -1 (unthrottled)")
        return self


class PlacementSettings(BaseModel):
    """Where ledgers' bookies go (shared/protocol/placement.py; docs/placement.md). Read by
    the gateway (new ensembles, ensemble changes), the replicator (re-replication targets)
    and the auditor (placement check): a deployment sets the same values on all three."""

    # BookKeeper's ensemblePlacementPolicy: random (DefaultEnsemblePlacementPolicy),
    # rackaware (RackawareEnsemblePlacementPolicy), zoneaware (ZoneawareEnsemblePlacementPolicy).
    policy: Literal["random", "rackaware", "zoneaware"] = "random"
    # rackaware: every write quorum on at least this many racks (minNumRacksPerWriteQuorum);
    # enforced, a ledger that cannot have it fails NOT_ENOUGH_BOOKIES, else it is placed at
    # random and counted (enforceMinNumRacksPerWriteQuorum).
    min_num_racks_per_write_quorum: int = Field(default=2, ge=1)
    enforce_min_num_racks_per_write_quorum: bool = False
    # zoneaware: minNumZonesPerWriteQuorum, desiredNumZonesPerWriteQuorum,
    # enforceStrictZoneawarePlacement.
    min_num_zones_per_write_quorum: int = Field(default=2, ge=1)
    desired_num_zones_per_write_quorum: int = Field(default=3, ge=1)
    enforce_strict_zoneaware_placement: bool = True

    @model_validator(mode="after")
    def _zones(self) -> PlacementSettings:
        if self.desired_num_zones_per_write_quorum < self.min_num_zones_per_write_quorum:
            raise ValueError(
                "desired_num_zones_per_write_quorum must be at least min_num_zones_per_write_quorum"
            )
        return self

    def rules(self) -> PlacementRules:
        return PlacementRules(**self.model_dump())


class QuireSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="QUIRE_", env_nested_delimiter="__", extra="ignore"
    )

    # One NATS server, or several of one cluster, comma-separated
    # ("nats://n1:4222,nats://n2:4222,nats://n3:4222"): a client connects to the first it
    # reaches, in order (list the nearest first), and reconnects to another when it is lost.
    nats_url: str = "nats://127.0.0.1:4222"
    # NATS credentials, when the server wants them: user and password, or an nkey seed
    # file; and a CA file to connect over TLS. `quire up` generates a user and password
    # for its own NATS (kept in DIR/nats/auth.json) and passes them here.
    nats_user: str = ""
    nats_password: SecretStr = SecretStr("")
    nats_nkey_seed_file: Path | None = None
    nats_tls_ca_file: Path | None = None
    # The replicas of the QUIRE_EVENTS stream when a service creates it (3 on a 3-node NATS
    # cluster). A stream that exists is used as it is: changing it is the operator's.
    event_stream_replicas: int = Field(default=1, ge=1, le=5)
    database_url: str = "postgresql+psycopg://quire@127.0.0.1:5432/quire"
    # Every subject starts with it, so that two clusters can share one NATS.
    subject_prefix: str = Field(default="quire", pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
    data_dir: Path = Path("./quire-data")
    # The bookie a journal or ledgerstore process serves.
    bookie_id: str = Field(default="bookie-1", pattern=r"^[A-Za-z0-9_-]+$")
    # The bookie's network location, "/zone/rack" (BookKeeper's networkLocation, given
    # here instead of resolved by DNS): its journal registers it for placement.
    bookie_location: str = DEFAULT_LOCATION
    # How `quire up` runs a bookie: "cohosted" (`python -m services.bookie`: journal and
    # ledgerstore in one process, the journal handing its durable records to the
    # ledgerstore in process: about a quarter less bookie CPU per entry, docs/performance.md
    # "Issue 20: one process per bookie") or "separate" (a process each, as deploy/ runs
    # them). `quire up --bookie-process`.
    bookie_process: Literal["separate", "cohosted"] = "cohosted"
    log_level: str = "INFO"
    # Bearer tokens the gateway accepts: comma-separated, or "@/path" to a file with one a
    # line. Empty: the APIs need no token (the local cluster's default, on 127.0.0.1).
    api_tokens: str = ""
    # NATS request timeout for service-to-service calls.
    request_timeout_ms: int = Field(default=5_000, ge=1)
    # The process's Prometheus metrics server (shared/metrics.py; docs/metrics.md): None
    # serves none, 0 an ephemeral port (logged). The gateway serves /metrics on its HTTP
    # port instead.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    # A co-hosted bookie (`services.bookie`) serves its journal's metrics on metrics_port
    # and its ledgerstore's on this one (None: none; 0: an ephemeral port).
    ledgerstore_metrics_port: int | None = Field(default=None, ge=0, le=65535)
    # QUIRE_FAULTS_DIR: set only by the fault suite (`quire/faults/`), one directory per
    # process. It switches on the in-process fault hooks: the bookie's files go through
    # `shared/bookie/fault_files.py:FaultFiles` and the wall clock reads an offset from it
    # (`shared/clock.py`). Unset, the code paths are the production ones.
    faults_dir: Path | None = None

    journal: JournalSettings = JournalSettings()
    ledgerstore: LedgerstoreSettings = LedgerstoreSettings()
    metadata: MetadataSettings = MetadataSettings()
    auditor: AuditorSettings = AuditorSettings()
    gateway: GatewaySettings = GatewaySettings()
    replicator: ReplicatorSettings = ReplicatorSettings()
    placement: PlacementSettings = PlacementSettings()

    @field_validator("bookie_location")
    @classmethod
    def _location(cls, value: str) -> str:
        return parse_location(value)

    @model_validator(mode="after")
    def _journal_apart_from_ledgers(self) -> QuireSettings:
        # The ledgerstore's directories hold entry logs and the index, a journal's its
        # files, lastMark and snapshot: one directory for two would mix what each lists.
        if len(set(self.journal_dirs)) < len(self.journal_dirs):
            raise ValueError(
                f"journal.journal_directories names a directory twice: {self.journal_dirs}"
            )
        shared = set(self.journal_dirs) & set(self.ledger_dirs)
        if shared:
            raise ValueError(
                f"journal.journal_directories and ledgerstore.ledger_directories share "
                f"{sorted(str(d) for d in shared)}: give the journal a directory of its own"
            )
        return self

    @property
    def bookie_dir(self) -> Path:
        """Every file of this bookie (journal, entry logs, index, cookie) lives here."""
        return self.data_dir / self.bookie_id

    @property
    def ledger_dirs(self) -> list[Path]:
        """This bookie's ledgerDirectories (see LedgerstoreSettings.ledger_directories)."""
        return self._bookie_paths(self.ledgerstore.ledger_directories)

    @property
    def journal_dirs(self) -> list[Path]:
        """This bookie's journalDirectories (see JournalSettings.journal_directories)."""
        return self._bookie_paths(self.journal.journal_directories)

    def _bookie_paths(self, names: list[str]) -> list[Path]:
        """Relative names under the bookie's dir; absolute ones with the bookie id appended,
        so that every bookie of one machine (`quire up`) has its own."""
        dirs = []
        for name in names:
            path = Path(name)
            dirs.append(path / self.bookie_id if path.is_absolute() else self.bookie_dir / path)
        return dirs


def nats_servers(url: str) -> list[str]:
    """The servers of a NATS URL setting (see `QuireSettings.nats_url`), in order."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ValueError("the NATS URL names no server")
    return servers


def load_settings() -> QuireSettings:
    return QuireSettings()
