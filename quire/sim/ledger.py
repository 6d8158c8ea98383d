"""One simulated ledger: its metadata row, its clients (a writer, recoveries, tailing readers)
and the invariants checked on it. A world holds several at once over the same bookies,
network, metadata store and clock; each checks its own acknowledgements, LAC, recoveries,
reads and final contents, so one ledger's entries showing up in another's breaks them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quire.sim.clients import ReaderClient, RecoveryClient, ReplicatorClient, WriterClient
from quire.sim.metadata import SimMetadata
from shared.digest import DigestManager, DigestType, master_key
from shared.models import LedgerMetadata, LedgerState, Segment
from shared.protocol.messages import CompleteAdds, EntryRead, ReadSendFailed, SendReads
from shared.protocol.reader import LedgerReader
from shared.quorum import write_set

if TYPE_CHECKING:
    from quire.sim.model import World


class SimLedger:
    """A ledger of the world. With several, `prefix` ("L2.") names its clients and `tag`
    ("L2 ") its metadata and end-of-run lines; with one both are empty, so a one-ledger
    transcript reads as it always has."""

    def __init__(self, world: World, ledger_id: int, ensemble: list[str]) -> None:
        config = world.config
        several = config.ledgers > 1
        self.world = world
        self.ledger_id = ledger_id
        self.prefix = f"L{ledger_id}." if several else ""
        self.tag = f"L{ledger_id} " if several else ""
        # A password (so a master key) per ledger: the bookies check the key per ledger, so
        # a request that reached another ledger's state would be refused, not taken.
        self.password = b"sim-password-%d" % ledger_id
        self.master_key = master_key(self.password)
        self.metadata = SimMetadata(
            world,
            LedgerMetadata(
                ledger_id=ledger_id,
                state=LedgerState.OPEN,
                ensemble_size=config.ensemble_size,
                write_quorum=config.write_quorum,
                ack_quorum=config.ack_quorum,
                digest=DigestType.CRC32C,
                segments=[Segment(first_entry_id=0, bookies=ensemble)],
            ),
            self.tag,
        )
        self.writer = WriterClient(world, self)
        self.recoveries = [
            RecoveryClient(world, self, f"recovery{i}") for i in range(config.recoveries)
        ]
        self.readers = [ReaderClient(world, self, f"reader{i}") for i in range(config.readers)]
        # Only in a world that loses a bookie: the others' runs stay as they were.
        self.replicator = ReplicatorClient(world, self) if world.loses_bookie else None
        self.acked: dict[int, bytes] = {}
        self.max_confirmed = -1
        self.recovered: list[int] = []
        self.max_reader_lac = -1

    def clients(self) -> list[WriterClient | RecoveryClient | ReaderClient | ReplicatorClient]:
        replicators = [self.replicator] if self.replicator is not None else []
        return [self.writer, *self.recoveries, *self.readers, *replicators]

    # -- activity

    def schedule_activity(self) -> None:
        world, config, rng = self.world, self.world.config, self.world.rng
        # Adds spread over the whole run, so that recoveries race a writer still writing.
        added = 0
        while added < config.entries:
            count = rng.randint(1, 3)
            world.at(rng.randint(1, config.duration_ms), self.writer.add, count)
            added += count
        for recovery in self.recoveries:
            world.at(rng.randint(config.duration_ms // 4, config.duration_ms), recovery.start)
        if config.close:
            world.at(rng.randint(config.duration_ms // 3, config.duration_ms), self.close)
        for reader in self.readers:
            for t in range(20, config.duration_ms + config.settle_ms, 60):
                world.at(t, reader.poll)

    def close(self) -> None:
        self.world.log(f"{self.writer.name} close")
        self.writer.core.start_close()
        self.writer.run()

    def final_recovery(self) -> RecoveryClient | None:
        """After the faults, a recovery for a ledger nobody closed."""
        if self.metadata.ledger.state is LedgerState.CLOSED:
            return None
        final = RecoveryClient(self.world, self, "final")
        self.recoveries.append(final)
        return final

    # -- invariants

    def on_acked(self, command: CompleteAdds) -> None:
        writer, check = self.writer, self.world.check
        check(
            command.first_entry_id == writer.acked + 1,
            f"acks in order, each once: got {command.first_entry_id}, last {writer.acked}",
        )
        check(command.lac == command.last_entry_id, "the LAC is the last acknowledged")
        metadata = writer.core.metadata
        quorum = metadata.quorum
        bookies = self.world.bookies
        for entry_id in range(command.first_entry_id, command.last_entry_id + 1):
            self.acked[entry_id] = writer.written[entry_id]
            # Acknowledged means durable on Qa bookies of its write set, as the metadata says.
            ensemble = metadata.segment_for(entry_id).bookies
            copies = sum(
                (self.ledger_id, entry_id) in bookies[ensemble[i]].entries
                for i in write_set(entry_id, quorum)
            )
            check(
                copies >= quorum.ack_quorum,
                f"{self.tag}entry {entry_id} acknowledged with {copies} durable copies "
                f"(Qa {quorum.ack_quorum})",
            )
        writer.acked = command.last_entry_id
        self.max_confirmed = max(self.max_confirmed, command.lac)
        self.world.log(f"{writer.name} ACK {command.first_entry_id}..{command.last_entry_id}")
        self.check_acked_within_close()

    def on_recovered(
        self, client: RecoveryClient | ReplicatorClient, metadata: LedgerMetadata
    ) -> None:
        last = metadata.last_entry_id
        assert last is not None
        self.world.log(f"{client.name} RECOVERED last={last}")
        if self.recovered:
            self.world.check(
                last == self.recovered[0],
                f"{self.tag}recoveries disagree: {self.recovered} {last}",
            )
        self.recovered.append(last)
        self.max_confirmed = max(self.max_confirmed, last)

    def check_reader_lac(self, name: str, lac: int) -> None:
        """A LAC a reader learns from the bookies was confirmed by a writer or a recovery,
        and (checked at the end) ends up inside the closed ledger."""
        self.world.check(
            lac <= self.max_confirmed,
            f"{name} saw LAC {lac} beyond every confirmation ({self.max_confirmed})",
        )
        self.max_reader_lac = max(self.max_reader_lac, lac)

    def check_read(self, name: str, entry: EntryRead, lac: int) -> None:
        check = self.world.check
        check(entry.entry_id <= lac, f"{name} read {entry.entry_id} beyond its LAC {lac}")
        written = self.writer.written.get(entry.entry_id)
        check(
            written == entry.payload,
            f"{name} read entry {entry.entry_id} = {entry.payload!r}, written {written!r}",
        )

    def check_acked_within_close(self) -> None:
        """Checked whenever either side moves (an acknowledgement, a metadata write): once
        the ledger is closed, every acknowledged entry is inside it."""
        ledger = self.metadata.ledger
        if ledger.state is LedgerState.CLOSED:
            last = ledger.last_entry_id
            assert last is not None
            self.world.check(
                self.writer.acked <= last,
                f"{self.tag}entry {self.writer.acked} was acknowledged but the ledger closed "
                f"at {last}",
            )

    def check_end(self) -> None:
        """Every acknowledged entry is there, in a ledger that is closed for good, readable
        by anyone, holding what its own writer wrote."""
        check, tag = self.world.check, self.tag
        ledger = self.metadata.ledger
        check(ledger.state is LedgerState.CLOSED, f"the ledger {tag}is closed ({ledger.state})")
        self.check_acked_within_close()
        last = ledger.last_entry_id
        assert last is not None
        for result in self.recovered:
            check(result == last, f"a recovery returned {result}, the ledger closed at {last}")
        check(
            self.max_reader_lac <= last,
            f"a reader saw LAC {self.max_reader_lac}, the ledger {tag}closed at {last}",
        )
        lost = self.world.lost
        for segment in ledger.segments:
            check(
                not lost & set(segment.bookies),
                f"{tag}segment at {segment.first_entry_id} still names a lost bookie "
                f"{segment.bookies} (lost {sorted(lost)})",
            )
        got = self.read_back(ledger)
        check(len(got) == last + 1, f"{tag}read {len(got)} of {last + 1} entries back")
        for entry_id, payload in got.items():
            check(
                payload == self.writer.written.get(entry_id),
                f"{tag}closed entry {entry_id} is {payload!r}",
            )
        for entry_id, payload in self.acked.items():
            check(got.get(entry_id) == payload, f"{tag}acknowledged entry {entry_id} lost")
        self.world.log(
            f"{tag}done: closed at {last}, {len(self.acked)} acknowledged, "
            f"{self.writer.core.ensemble_changes} ensemble changes, "
            f"recoveries {self.recovered}"
        )

    def read_back(self, ledger: LedgerMetadata) -> dict[int, bytes]:
        """Read the closed ledger with the real reader, every bookie answering at once but
        a lost one (the copies left must do)."""
        bookies = self.world.bookies
        for bookie in bookies.values():
            bookie.unsure_until_ms = -1  # the ledgerstores have caught up by now
        reader = LedgerReader(ledger, DigestManager(ledger.digest, self.password))
        assert ledger.last_entry_id is not None
        now_ms = self.world.now_ms
        reader.read(0, ledger.last_entry_id, now_ms)
        got: dict[int, bytes] = {}
        while not reader.done:
            for command in reader.take_commands():
                if isinstance(command, SendReads) and command.bookie_id in self.world.lost:
                    gone = ReadSendFailed(command.bookie_id, command.entry_ids, "lost", False)
                    reader.step(gone, now_ms)
                elif isinstance(command, SendReads):
                    reader.step(bookies[command.bookie_id].read(command), now_ms)
                elif isinstance(command, EntryRead):
                    got[command.entry_id] = command.payload
                else:
                    self.world.check(False, f"reading the closed ledger back: {command}")
        for command in reader.take_commands():
            if isinstance(command, EntryRead):
                got[command.entry_id] = command.payload
        return got
