"""The bookie's identity cookie (BookKeeper's Cookie): bookie id, cluster instance id and
directories, kept in `<bookie_dir>/cookie` and in metadata (`cookie.get`/`cookie.put`).

At start the journal compares the three:
- they agree: start;
- nothing anywhere: a new bookie; write both;
- the disk has one, metadata none: register it (metadata was set up after the bookie);
- they disagree (another bookie id, other directories, another cluster): refuse to start,
  saying which field differs and how to fix it;
- metadata has one, the disk none: the disk was wiped or replaced. The bookie starts, with
  a new cookie marked `limbo`: it answers UNKNOWN_LEDGER_STATE, never NO_ENTRY, for entries
  it may have held before (ledgers it has not seen since, and entries below the first it
  has seen since). The auditor has every ledger with a fragment on it re-replicated, then
  asks the journal to clear `limbo` (`clear_limbo`): the operator's whole procedure for a
  wiped bookie is to start it again (docs/storage.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from shared.bookie.files import OS_FILES, FileLayer

log = logging.getLogger(__name__)

COOKIE_FILE = "cookie"
COOKIE_LAYOUT_VERSION = 1
NO_INSTANCE = ""  # the instance id was not known when the cookie was written


class CookieMismatch(RuntimeError):
    """The bookie's disk does not belong to this bookie or cluster: refuse to start."""


@dataclass(frozen=True)
class Cookie:
    bookie_id: str
    journal_dir: str
    ledger_dirs: list[str] = field(default_factory=list)
    instance_id: str = NO_INSTANCE
    layout_version: int = COOKIE_LAYOUT_VERSION
    # The disk was found wiped: see the module docstring. Survives restarts.
    limbo: bool = False
    # Written on an empty disk while metadata could not be asked: a new bookie or a wiped
    # one, to be told apart (and turned `limbo` if wiped) once metadata answers.
    provisional: bool = False
    # The journal directories after the first (journal_dir), in order. Left out of the
    # encoding when there are none, so that a one-journal bookie's cookie is as it was.
    more_journal_dirs: list[str] = field(default_factory=list)

    def encode(self) -> str:
        fields = asdict(self)
        if not self.more_journal_dirs:
            del fields["more_journal_dirs"]
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def decode(cls, data: str) -> Cookie:
        try:
            raw = json.loads(data)
            return cls(**raw)
        except (ValueError, TypeError) as exc:
            raise CookieMismatch(f"unreadable cookie: {exc}") from exc


def mismatch(expected: Cookie, found: Cookie, where: str) -> str | None:
    """Why `found` (from `where`) is not this bookie's cookie; None if it is."""
    for name in ("bookie_id", "journal_dir", "more_journal_dirs", "ledger_dirs"):
        if getattr(expected, name) != getattr(found, name):
            return (
                f"the cookie in {where} says {name}={getattr(found, name)!r}, this bookie is "
                f"configured with {getattr(expected, name)!r}"
            )
    if NO_INSTANCE not in (expected.instance_id, found.instance_id) and (
        expected.instance_id != found.instance_id
    ):
        return (
            f"the cookie in {where} belongs to cluster instance {found.instance_id!r}, the "
            f"metadata service is instance {expected.instance_id!r}"
        )
    return None


def read_disk_cookie(bookie_dir: Path) -> Cookie | None:
    path = bookie_dir / COOKIE_FILE
    return Cookie.decode(path.read_text()) if path.exists() else None


def keeps_cookie_copy(bookie_dir: Path, journal_dir: Path) -> bool:
    """Whether a journal directory keeps a copy of the cookie: when it is outside the
    bookie's dir (a disk of its own, as BookKeeper keeps a cookie in every directory);
    not when it is inside, on the cookie's disk (the one cookie speaks for it)."""
    return not journal_dir.resolve().is_relative_to(bookie_dir.resolve())


def write_disk_cookie(
    bookie_dir: Path,
    cookie: Cookie,
    files: FileLayer = OS_FILES,
    journal_copies: Sequence[Path] = (),
) -> None:
    """The cookie in the bookie's dir; first a copy in each of `journal_copies`
    (`keeps_cookie_copy`), so that a bookie's cookie never exists without its journals'."""
    data = (cookie.encode() + "\n").encode()
    for directory in [*journal_copies, bookie_dir]:
        directory.mkdir(parents=True, exist_ok=True)
        files.write_atomic(directory / COOKIE_FILE, data)


def check_journal_copy(expected: Cookie, disk: Cookie | None, journal_copy: Path) -> None:
    """A journal on a disk of its own must be this bookie's: its copy of the cookie names
    this bookie, and it has one whenever the bookie's dir has a cookie. Else the journal's
    disk is not mounted there, or was lost or replaced: starting would forget the fences
    and master keys that journal held. Raises CookieMismatch."""
    copy = read_disk_cookie(journal_copy)
    if copy is not None:
        problem = mismatch(expected, copy, f"the journal directory {journal_copy}")
        if problem:
            raise CookieMismatch(_refusal(problem))
    elif disk is not None:
        raise CookieMismatch(
            f"refusing to start: this bookie has a cookie but its journal directory "
            f"{journal_copy} has none: the journal's disk is not mounted there, or was lost "
            "or replaced (with the fences and master keys it held). Mount it; if it is "
            "lost, empty all of the bookie's directories and start it again: it rejoins in "
            "limbo (docs/storage.md, 'A wiped bookie')"
        )


def reconcile(
    expected: Cookie, disk: Cookie | None, meta: Cookie | None, has_data: bool
) -> tuple[Cookie, bool]:
    """The cookie to keep on disk, and whether metadata must be given it. Raises
    CookieMismatch when the disk is not this bookie's."""
    if disk is not None:
        problem = mismatch(expected, disk, "the bookie's disk")
        if problem:
            raise CookieMismatch(_refusal(problem))
    if meta is not None:
        problem = mismatch(expected, meta, "metadata")
        if problem:
            raise CookieMismatch(_refusal(problem))
    if disk is not None and meta is not None:
        problem = mismatch(disk, meta, "metadata (against the disk's)")
        if problem:
            raise CookieMismatch(_refusal(problem))
        if disk.provisional:
            # Started on an empty disk while metadata was away, and metadata knew this
            # bookie: the disk was wiped.
            log.error("bookie disk was wiped: answering UNKNOWN for entries it may have held")
            return replace(disk, instance_id=meta.instance_id, limbo=True, provisional=False), False
        return disk, False
    if disk is not None:
        instance = disk.instance_id or expected.instance_id
        return replace(disk, instance_id=instance, provisional=False), True
    if meta is not None:
        if has_data:  # files from before cookies existed, already known to metadata
            return replace(expected, instance_id=meta.instance_id), False
        # Known to the cluster, nothing on disk: wiped or replaced. Serve, but never claim
        # absence of what it may have held.
        log.error("bookie disk was wiped: answering UNKNOWN for entries it may have held")
        return replace(expected, instance_id=meta.instance_id, limbo=True), False
    return expected, True


def reconcile_offline(expected: Cookie, disk: Cookie | None, has_data: bool) -> Cookie:
    """The cookie to keep on disk while metadata cannot be asked."""
    if disk is not None:
        problem = mismatch(expected, disk, "the bookie's disk")
        if problem:
            raise CookieMismatch(_refusal(problem))
        return disk
    return replace(expected, provisional=not has_data)


def _refusal(problem: str) -> str:
    return (
        f"refusing to start: {problem}. If the directories moved, fix the settings "
        "(QUIRE_BOOKIE_ID, QUIRE_DATA_DIR, QUIRE_JOURNAL__JOURNAL_DIRECTORIES, "
        "QUIRE_LEDGERSTORE__LEDGER_DIRECTORIES); if this "
        "disk belongs to another bookie or cluster, use another data dir"
    )
