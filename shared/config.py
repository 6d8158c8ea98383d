"""Every setting of every Quire service, in one pydantic-settings tree.

Environment variables are `QUIRE_<FIELD>` for top-level fields and
`QUIRE_<SECTION>__<FIELD>` for nested ones, e.g. `QUIRE_JOURNAL__MAX_GROUP_WAIT_MS=1`.
Each field names the BookKeeper setting it mirrors where there is one, so that an
operator who tuned BookKeeper finds the same lever here.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

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
    # journalQueueSize: adds waiting for the journal writer; beyond it, TOO_MANY_REQUESTS.
    queue_size: int = Field(default=10_000, ge=1)
    # journalMaxSizeMB: roll to a new journal file past this size.
    max_size_mb: int = Field(default=256, ge=1)


class LedgerstoreSettings(BaseModel):
    # logSizeLimit: roll to a new entry log file past this size.
    log_size_limit_bytes: int = Field(default=512 * MIB, ge=4096)
    # flushInterval: how often the ledgerstore checkpoints (fsyncs entry logs and index,
    # then moves the journal's LastLogMark).
    flush_interval_ms: int = Field(default=1000, ge=10)
    # How often it looks at the journal for new records when no notification came.
    journal_poll_interval_ms: int = Field(default=200, ge=1)


class MetadataSettings(BaseModel):
    # How long a bookie stays registered without a heartbeat (ZooKeeper's session timeout).
    bookie_lease_ms: int = Field(default=10_000, ge=100)
    # How often bookies renew their lease.
    bookie_heartbeat_ms: int = Field(default=2_000, ge=50)
    # Requests served at once by one metadata instance.
    max_in_flight: int = Field(default=64, ge=1)
    # Size of the SQLAlchemy connection pool.
    db_pool_size: int = Field(default=8, ge=1)


class GatewaySettings(BaseModel):
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=7480, ge=0, le=65535)
    grpc_port: int = Field(default=7481, ge=0, le=65535)
    # nettyMaxFrameSizeBytes' role: the largest entry a client may append.
    max_entry_size_bytes: int = Field(default=5 * MIB, ge=1)
    # The most entries one batch append may carry.
    max_batch_entries: int = Field(default=10_000, ge=1)
    # The most bytes one append request body may carry (a JSON batch is base64): 413 beyond.
    max_batch_bytes: int = Field(default=64 * MIB, ge=1)
    # addEntryTimeoutSec: an add not acknowledged by then fails with TIMEOUT.
    add_entry_timeout_ms: int = Field(default=10_000, ge=10)
    # readEntryTimeoutSec: a bookie read not answered by then moves to the next replica.
    read_entry_timeout_ms: int = Field(default=2_000, ge=10)
    # The longest a LAC long poll may wait.
    long_poll_max_timeout_ms: int = Field(default=60_000, ge=0)
    # Adds in flight per ledger before appends wait (back-pressure).
    max_pending_adds_per_ledger: int = Field(default=10_000, ge=1)
    # /readyz answers 200 only once this many writable bookies are registered.
    ready_min_writable_bookies: int = Field(default=1, ge=0)


class QuireSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="QUIRE_", env_nested_delimiter="__", extra="ignore"
    )

    nats_url: str = "nats://127.0.0.1:4222"
    database_url: str = "postgresql+psycopg://quire@127.0.0.1:5432/quire"
    # Every subject starts with it, so that two clusters can share one NATS.
    subject_prefix: str = Field(default="quire", pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
    data_dir: Path = Path("./quire-data")
    # The bookie a journal or ledgerstore process serves.
    bookie_id: str = Field(default="bookie-1", pattern=r"^[A-Za-z0-9_-]+$")
    log_level: str = "INFO"
    # NATS request timeout for service-to-service calls.
    request_timeout_ms: int = Field(default=5_000, ge=1)

    journal: JournalSettings = JournalSettings()
    ledgerstore: LedgerstoreSettings = LedgerstoreSettings()
    metadata: MetadataSettings = MetadataSettings()
    gateway: GatewaySettings = GatewaySettings()

    @property
    def bookie_dir(self) -> Path:
        """Every file of this bookie (journal, entry logs, index, cookie) lives here."""
        return self.data_dir / self.bookie_id


def load_settings() -> QuireSettings:
    return QuireSettings()
