"""The PostgreSQL store's statements: built once, prepared by psycopg after a few uses.

Each change is one statement: the change, what it replaced, and its outbox row, as
data-modifying CTEs (a lost compare-and-set is re-read by a second one). The tables are
defined in services/metadata/schema.py and made by the Alembic migrations.
"""

from __future__ import annotations

from services.metadata import core

# Model field -> column, for the ledger JSON PostgreSQL builds for the outbox.
LEDGER_FIELDS = {
    "ledger_id": "ledger_id",
    "version": "version",
    "state": "state",
    "ensemble_size": "ensemble_size",
    "write_quorum": "write_quorum",
    "ack_quorum": "ack_quorum",
    "digest": "digest",
    "last_entry_id": "last_entry_id",
    "length": "length",
    "ctime": "ctime",
    "metadata": "custom_metadata",
    "segments": "segments",
    "password_salt": "password_salt",
    "password_hash": "password_hash",
    "format_version": "format_version",
    "creator_token": "creator_token",
    "master_key": "master_key",
    "mac_key": "mac_key",
}


def ledger_json_sql(alias: str) -> str:
    """SQL for the model's JSON of a ledger row (what the outbox record carries)."""
    pairs = ", ".join(f"'{f}', {alias}.{c}" for f, c in LEDGER_FIELDS.items())
    return f"jsonb_build_object({pairs})"


def _outbox_insert(
    kind: str, source: str, data_sql: str, where: str = "true", ts_sql: str = "%(now)s"
) -> str:
    """The outbox row of a change, inserted by the statement that makes the change."""
    return f"""
    INSERT INTO outbox (kind, ledger_id, bookie_id, data, ts_ms)
    SELECT '{kind}', {source}.ledger_id, NULL, {data_sql}, {ts_sql} FROM {source} WHERE {where}"""


def _outbox_insert_bookie(kind: str, source: str, data_sql: str, where: str = "true") -> str:
    return f"""
    INSERT INTO outbox (kind, ledger_id, bookie_id, data, ts_ms)
    SELECT '{kind}', NULL, {source}.bookie_id, {data_sql}, %(now)s FROM {source} WHERE {where}"""


SQL_INSTANCE_ID = "SELECT instance_id FROM cluster WHERE id = 1"

_CREATED_DATA = f"jsonb_build_object('metadata', {ledger_json_sql('ins')})"
# COALESCE evaluates nextval only when no id was chosen.
SQL_CREATE_LEDGER = f"""
WITH ins AS (
    INSERT INTO ledgers (ledger_id, version, state, ensemble_size, write_quorum, ack_quorum,
        digest, last_entry_id, length, ctime, custom_metadata, segments, password_salt,
        password_hash, format_version, creator_token, master_key, mac_key)
    VALUES (COALESCE(%(ledger_id)s::bigint, nextval('ledger_id_seq')), 0, %(state)s,
        %(ensemble_size)s, %(write_quorum)s, %(ack_quorum)s, %(digest)s, NULL, 0, %(ctime)s,
        %(custom_metadata)s, %(segments)s, %(password_salt)s, %(password_hash)s,
        %(format_version)s, %(creator_token)s, %(master_key)s, %(mac_key)s)
    ON CONFLICT (ledger_id) DO NOTHING
    RETURNING *
), ev AS ({_outbox_insert(core.LEDGER_CREATED, "ins", _CREATED_DATA)})
SELECT * FROM ins"""

# Group commit (services/metadata/batch.py): several creates, each a sequence id, in one
# statement; each parameter is an array with one element a create, `n` its place. A row
# whose id was taken by a user-chosen one comes back with a NULL ledger: that create is
# done again alone (SQL_CREATE_LEDGER, which moves the sequence past the taken run).
# `req` calls nextval, so it is computed once (never inlined), and ins joins back on the id.
LEDGER_CREATE_ARRAYS = {
    "state": "text",
    "ensemble_size": "int",
    "write_quorum": "int",
    "ack_quorum": "int",
    "digest": "text",
    "ctime": "bigint",
    "custom_metadata": "jsonb",
    "segments": "jsonb",
    "password_salt": "text",
    "password_hash": "text",
    "format_version": "int",
    "creator_token": "bigint",
    "master_key": "text",
    "mac_key": "text",
    "now": "bigint",
}
_CREATE_COLUMNS = [c for c in LEDGER_CREATE_ARRAYS if c != "now"]
SQL_CREATE_LEDGERS = f"""
WITH req AS (
    SELECT r.*, nextval('ledger_id_seq') AS id FROM unnest({
    ", ".join(f"%({c})s::{t}[]" for c, t in LEDGER_CREATE_ARRAYS.items())
}) WITH ORDINALITY AS r({", ".join(LEDGER_CREATE_ARRAYS)}, n)
), ins AS (
    INSERT INTO ledgers (ledger_id, version, last_entry_id, length, {", ".join(_CREATE_COLUMNS)})
    SELECT req.id, 0, NULL, 0, {", ".join(f"req.{c}" for c in _CREATE_COLUMNS)} FROM req
    ORDER BY req.n
    ON CONFLICT (ledger_id) DO NOTHING
    RETURNING *
), ev AS ({
    _outbox_insert(
        core.LEDGER_CREATED,
        "ins",
        _CREATED_DATA,
        ts_sql="(SELECT req.now FROM req WHERE req.id = ins.ledger_id)",
    )
})
SELECT req.n AS batch_index, ins.* FROM req LEFT JOIN ins ON ins.ledger_id = req.id"""

# The sequence ran into user-chosen ids: move it past that run of taken ids, only ever
# forward (an id it gave out must never come back). currval is this session's last id.
SQL_SKIP_TAKEN_IDS = """
SELECT count(nextval('ledger_id_seq')) FROM generate_series(1, (
    SELECT min(l.ledger_id) FROM ledgers l
    WHERE l.ledger_id >= currval('ledger_id_seq')
      AND NOT EXISTS (SELECT 1 FROM ledgers m WHERE m.ledger_id = l.ledger_id + 1)
) - currval('ledger_id_seq'))"""

SQL_GET_LEDGER = "SELECT * FROM ledgers WHERE ledger_id = %(id)s"
SQL_LIST_LEDGERS = """
SELECT * FROM ledgers WHERE ledger_id > %(after)s ORDER BY ledger_id LIMIT %(fetch_limit)s"""
SQL_LEDGER_IDS = """
SELECT ledger_id FROM ledgers WHERE ledger_id > %(after)s ORDER BY ledger_id
LIMIT %(fetch_limit)s"""

# The compare-and-set, of one ledger or of several (never one twice) in one statement
# (group commit), `req` the requests. `old` locks each row at
# its expected version and keeps its old values, so one statement sets, tells what it
# replaced, and writes the outbox row. A NULL leaves its field as it is. The rows are
# locked in ledger order, so two batches never wait for each other in a cycle.
LEDGER_CAS_ARRAYS = {
    "id": "bigint",
    "expected": "int",
    "state": "text",
    "last_entry_id": "bigint",
    "length": "bigint",
    "segments": "jsonb",
    "now": "bigint",
}


def _cas_ledgers_sql(req: str) -> str:
    return f"""
WITH req AS ({req}), old AS (
    SELECT l.ledger_id, l.state, l.segments, req.* FROM ledgers l JOIN req ON l.ledger_id = r_id
    WHERE l.version = r_expected
        -- A closed ledger never reopens; its last entry and length never change.
        AND (l.state <> 'CLOSED' OR (
            COALESCE(r_state, 'CLOSED') = 'CLOSED'
            AND (r_last_entry_id IS NULL OR r_last_entry_id IS NOT DISTINCT FROM l.last_entry_id)
            AND (r_length IS NULL OR r_length = l.length)))
    ORDER BY l.ledger_id
    FOR UPDATE OF l
), upd AS (
    UPDATE ledgers l SET
        version = l.version + 1,
        state = COALESCE(old.r_state, l.state),
        last_entry_id = COALESCE(old.r_last_entry_id, l.last_entry_id),
        length = COALESCE(old.r_length, l.length),
        segments = COALESCE(old.r_segments, l.segments)
    FROM old
    WHERE l.ledger_id = old.ledger_id AND l.version = old.r_expected
    RETURNING l.*, old.state AS previous_state,
        l.segments IS DISTINCT FROM old.segments AS segments_changed, old.r_now
), ev AS ({
        _outbox_insert(
            core.LEDGER_CHANGED,
            "upd",
            f"jsonb_build_object('metadata', {ledger_json_sql('upd')}, "
            "'previous_state', upd.previous_state, 'segments_changed', upd.segments_changed)",
            ts_sql="upd.r_now",
        )
    })
SELECT * FROM upd"""


# Several requests: each parameter an array, one element a request.
SQL_CAS_LEDGERS = _cas_ledgers_sql(
    f"SELECT * FROM unnest({', '.join(f'%({c})s::{t}[]' for c, t in LEDGER_CAS_ARRAYS.items())})"
    f" AS r({', '.join(f'r_{c}' for c in LEDGER_CAS_ARRAYS)})"
)
# One request, the same statement from plain parameters (cheaper to send and to run).
SQL_CAS_LEDGER = _cas_ledgers_sql(
    f"SELECT {', '.join(f'%({c})s::{t} AS r_{c}' for c, t in LEDGER_CAS_ARRAYS.items())}"
)

SQL_DELETE_LEDGER = f"""
WITH del AS (
    DELETE FROM ledgers WHERE ledger_id = %(id)s RETURNING ledger_id
), ev AS ({_outbox_insert(core.LEDGER_DELETED, "del", "jsonb_build_object()")})
SELECT ledger_id FROM del"""

# Register or renew, returning the row as it was before. The outbox row only for news:
# a first registration or a change of the effective state (lost once the lease lapsed),
# as core.registration_is_news decides it.
SQL_UPSERT_BOOKIE = f"""
WITH old AS (
    SELECT state, lease_expires_at,
        CASE WHEN lease_expires_at <= %(now)s THEN 'lost' ELSE state END AS effective
    FROM bookies WHERE bookie_id = %(id)s
), up AS (
    INSERT INTO bookies (bookie_id, state, last_seen, lease_expires_at, info)
    VALUES (%(id)s, %(state)s, %(now)s, %(expires)s, %(info)s)
    ON CONFLICT (bookie_id) DO UPDATE SET state = excluded.state,
        last_seen = excluded.last_seen, lease_expires_at = excluded.lease_expires_at,
        info = excluded.info
    RETURNING *
), news AS (
    SELECT up.bookie_id, up.state, up.lease_expires_at,
        (SELECT effective FROM old) AS previous_state
    FROM up
), ev AS ({
    _outbox_insert_bookie(
        "bookie.registered",
        "news",
        "jsonb_build_object('state', news.state, 'previous_state', news.previous_state, "
        "'lease_expires_at', news.lease_expires_at)",
        "news.previous_state IS DISTINCT FROM news.state",
    )
})
SELECT up.*, (SELECT state FROM old) AS previous_state,
    (SELECT lease_expires_at FROM old) AS previous_lease_expires_at
FROM up"""

SQL_EXPIRE_BOOKIE = f"""
WITH up AS (
    UPDATE bookies SET lease_expires_at = LEAST(lease_expires_at, %(now)s)
    WHERE bookie_id = %(id)s RETURNING *
), ev AS ({_outbox_insert_bookie("bookie.unregistered", "up", "jsonb_build_object()")})
SELECT * FROM up"""

# Only a lapsed lease (core.lease_expired) is removed; the caller tells a live bookie from an
# unknown one by reading the row again.
SQL_REMOVE_BOOKIE = f"""
WITH gone AS (
    DELETE FROM bookies WHERE bookie_id = %(id)s AND lease_expires_at <= %(now)s RETURNING *
), ev AS ({
    _outbox_insert_bookie(
        "bookie.removed",
        "gone",
        "jsonb_build_object('last_seen', gone.last_seen, "
        "'lease_expires_at', gone.lease_expires_at)",
    )
})
SELECT * FROM gone"""
SQL_GET_BOOKIE = "SELECT * FROM bookies WHERE bookie_id = %(id)s"

SQL_LIST_BOOKIES = "SELECT * FROM bookies ORDER BY bookie_id LIMIT %(limit)s"

SQL_GET_COOKIE = "SELECT data, version FROM cookies WHERE bookie_id = %(id)s"
_COOKIE_EVENT = "jsonb_build_object('version', c.version)"
SQL_CREATE_COOKIE = f"""
WITH c AS (
    INSERT INTO cookies (bookie_id, data, version) VALUES (%(id)s, %(data)s, 0)
    ON CONFLICT (bookie_id) DO NOTHING RETURNING *
), ev AS ({_outbox_insert_bookie("bookie.cookie_written", "c", _COOKIE_EVENT)})
SELECT * FROM c"""
SQL_CAS_COOKIE = f"""
WITH c AS (
    UPDATE cookies SET data = %(data)s, version = version + 1
    WHERE bookie_id = %(id)s AND version = %(expected)s RETURNING *
), ev AS ({_outbox_insert_bookie("bookie.cookie_written", "c", _COOKIE_EVENT)})
SELECT * FROM c"""
SQL_DELETE_COOKIE = f"""
WITH c AS (
    DELETE FROM cookies WHERE bookie_id = %(id)s AND version = %(expected)s RETURNING *
), ev AS ({_outbox_insert_bookie("bookie.cookie_deleted", "c", _COOKIE_EVENT)})
SELECT * FROM c"""

SQL_GET_SETTINGS = "SELECT name, value FROM cluster_settings"
SQL_SET_SETTINGS = """
WITH up AS (
    INSERT INTO cluster_settings (name, value)
    SELECT key, value FROM jsonb_each(%(changes)s::jsonb)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value
    RETURNING name
), ev AS (
    INSERT INTO outbox (kind, ledger_id, bookie_id, data, ts_ms)
    VALUES ('cluster.settings_changed', NULL, NULL, %(changes)s::jsonb, %(now)s)
)
SELECT count(*) AS changed FROM up"""

# Adding to an existing mark: the union of missing bookies; the mark version moves only
# when a bookie was added (core.merge_mark), and only then is there an event. `old` is
# the statement's snapshot (it cannot lock: the row is updated by this very statement),
# so two racing marks adding the same bookie may both publish an event; the queue itself
# is exact.
SQL_MARK_URQ = f"""
WITH old AS (
    SELECT mark_version FROM underreplicated_ledgers WHERE ledger_id = %(id)s
), up AS (
    INSERT INTO underreplicated_ledgers AS u
        (ledger_id, missing_bookies, mark_version, marked_at, claimed_by, claim_expires_at)
    VALUES (%(id)s, %(missing)s, 1, %(now)s, NULL, NULL)
    ON CONFLICT (ledger_id) DO UPDATE SET
        missing_bookies = (
            SELECT jsonb_agg(DISTINCT b ORDER BY b)
            FROM jsonb_array_elements_text(u.missing_bookies || excluded.missing_bookies) b
        ),
        mark_version = u.mark_version
            + CASE WHEN excluded.missing_bookies <@ u.missing_bookies THEN 0 ELSE 1 END
    RETURNING u.*
), ev AS ({
    _outbox_insert(
        "ledger.underreplicated",
        "up",
        "jsonb_build_object('missing_bookies', up.missing_bookies, "
        "'mark_version', up.mark_version)",
        "up.mark_version IS DISTINCT FROM (SELECT mark_version FROM old)",
    )
})
SELECT * FROM up"""

# SKIP LOCKED: racing workers each take a different row; a row a committed claim holds is
# re-checked against the WHERE (lease still running) and passed over.
SQL_CLAIM_URQ = """
WITH pick AS (
    SELECT ledger_id FROM underreplicated_ledgers
    WHERE (claimed_by IS NULL OR claim_expires_at <= %(now)s)
      AND COALESCE(
        (SELECT value FROM cluster_settings WHERE name = 'autorecovery_enabled'),
        'true'::jsonb) = 'true'::jsonb
    ORDER BY marked_at, ledger_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE underreplicated_ledgers u
SET claimed_by = %(worker)s, claim_expires_at = %(expires)s
FROM pick WHERE u.ledger_id = pick.ledger_id
RETURNING u.*"""

SQL_RENEW_URQ = """
UPDATE underreplicated_ledgers SET claim_expires_at = %(expires)s
WHERE ledger_id = %(id)s AND claimed_by = %(worker)s RETURNING ledger_id"""
SQL_RELEASE_URQ = """
UPDATE underreplicated_ledgers SET claimed_by = NULL, claim_expires_at = NULL
WHERE ledger_id = %(id)s AND claimed_by = %(worker)s RETURNING ledger_id"""
# The two branches exclude each other (same mark version or not), so one row is touched
# at most once.
SQL_REPLICATED_URQ = f"""
WITH del AS (
    DELETE FROM underreplicated_ledgers
    WHERE ledger_id = %(id)s AND claimed_by = %(worker)s
      AND (%(mv)s::int IS NULL OR mark_version = %(mv)s::int)
    RETURNING ledger_id, mark_version
), rel AS (
    UPDATE underreplicated_ledgers SET claimed_by = NULL, claim_expires_at = NULL
    WHERE ledger_id = %(id)s AND claimed_by = %(worker)s
      AND %(mv)s::int IS NOT NULL AND mark_version <> %(mv)s::int
    RETURNING ledger_id
), ev AS ({
    _outbox_insert(
        "ledger.replicated", "del", "jsonb_build_object('mark_version', del.mark_version)"
    )
})
SELECT (SELECT count(*) FROM del) AS deleted, (SELECT count(*) FROM rel) AS released"""
SQL_LIST_URQ = """
SELECT * FROM underreplicated_ledgers WHERE ledger_id > %(after)s ORDER BY ledger_id
LIMIT %(fetch_limit)s"""

# Election: the one row, locked and read as it is now by `old`. Each statement answers
# the row as it is after it (one that changed nothing answers it as it was). A new term
# when another candidate wins or the lease had lapsed (core.elect decides alike).
_ELECTION_OLD = "SELECT * FROM auditor_election WHERE id = 1 FOR UPDATE"
_ELECTION_ANSWER = """
SELECT leader_id, term, lease_expires_at FROM upd
UNION ALL
SELECT leader_id, term, lease_expires_at FROM old WHERE NOT EXISTS (SELECT 1 FROM upd)"""
SQL_ELECT = f"""
WITH old AS ({_ELECTION_OLD}), upd AS (
    UPDATE auditor_election e SET
        term = CASE WHEN old.leader_id = %(c)s AND old.lease_expires_at > %(now)s
            THEN old.term ELSE old.term + 1 END,
        leader_id = %(c)s,
        lease_expires_at = %(expires)s
    FROM old
    WHERE e.id = 1 AND (old.leader_id IS NULL OR old.lease_expires_at <= %(now)s
        OR old.leader_id = %(c)s)
    RETURNING e.leader_id, e.term, e.lease_expires_at, e.term <> old.term AS new_term
), ev AS (
    INSERT INTO outbox (kind, ledger_id, bookie_id, data, ts_ms)
    SELECT 'auditor.elected', NULL, NULL,
        jsonb_build_object('leader_id', upd.leader_id, 'term', upd.term), %(now)s
    FROM upd WHERE upd.new_term
)
{_ELECTION_ANSWER}"""
SQL_RENEW_LEADER = f"""
WITH old AS ({_ELECTION_OLD}), upd AS (
    UPDATE auditor_election e SET lease_expires_at = %(expires)s
    FROM old
    WHERE e.id = 1 AND old.leader_id = %(c)s AND old.lease_expires_at > %(now)s
    RETURNING e.leader_id, e.term, e.lease_expires_at
)
{_ELECTION_ANSWER}"""
SQL_RESIGN = f"""
WITH old AS ({_ELECTION_OLD}), upd AS (
    UPDATE auditor_election e SET lease_expires_at = LEAST(old.lease_expires_at, %(now)s)
    FROM old
    WHERE e.id = 1 AND old.leader_id = %(c)s
    RETURNING e.leader_id, e.term, e.lease_expires_at
)
{_ELECTION_ANSWER}"""
SQL_WHO = "SELECT leader_id, term, lease_expires_at FROM auditor_election WHERE id = 1"

SQL_TRY_OUTBOX_LOCK = "SELECT pg_try_advisory_lock(%(key)s) AS locked"
SQL_OUTBOX_CURSOR = "SELECT last_published_id FROM outbox_cursor WHERE id = 1"
SQL_OUTBOX_FETCH = """
SELECT o.*, pg_current_snapshot()::text AS snapshot FROM outbox o ORDER BY o.id
LIMIT %(limit)s"""
SQL_OUTBOX_PUBLISHED = """
WITH gone AS (DELETE FROM outbox WHERE id = ANY(%(ids)s))
UPDATE outbox_cursor SET last_published_id = GREATEST(last_published_id, %(last)s)
WHERE id = 1"""
# Both in one statement: the previous batch marked, the next one read. The read sees the
# rows as they were when the statement began (its deletes included), hence the filter;
# its snapshot is the one the statement ran with.
SQL_OUTBOX_PUBLISHED_FETCH = """
WITH gone AS (DELETE FROM outbox WHERE id = ANY(%(ids)s::bigint[])), mark AS (
    UPDATE outbox_cursor SET last_published_id = GREATEST(last_published_id, %(last)s)
    WHERE id = 1
)
SELECT o.*, pg_current_snapshot()::text AS snapshot FROM outbox o
WHERE o.id <> ALL(%(ids)s::bigint[]) ORDER BY o.id
LIMIT %(limit)s"""
