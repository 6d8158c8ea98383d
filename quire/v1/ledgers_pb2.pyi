from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Segment(_message.Message):
    __slots__ = ("first_entry_id", "bookies")
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BOOKIES_FIELD_NUMBER: _ClassVar[int]
    first_entry_id: int
    bookies: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, first_entry_id: _Optional[int] = ..., bookies: _Optional[_Iterable[str]] = ...) -> None: ...

class Ledger(_message.Message):
    __slots__ = ("ledger_id", "state", "ensemble_size", "write_quorum", "ack_quorum", "digest", "last_entry_id", "length", "version", "ctime", "metadata", "segments")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ENSEMBLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUORUM_FIELD_NUMBER: _ClassVar[int]
    ACK_QUORUM_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CTIME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    state: str
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    digest: str
    last_entry_id: int
    length: int
    version: int
    ctime: int
    metadata: _containers.ScalarMap[str, str]
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    def __init__(self, ledger_id: _Optional[int] = ..., state: _Optional[str] = ..., ensemble_size: _Optional[int] = ..., write_quorum: _Optional[int] = ..., ack_quorum: _Optional[int] = ..., digest: _Optional[str] = ..., last_entry_id: _Optional[int] = ..., length: _Optional[int] = ..., version: _Optional[int] = ..., ctime: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("ensemble_size", "write_quorum", "ack_quorum", "digest", "password", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENSEMBLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUORUM_FIELD_NUMBER: _ClassVar[int]
    ACK_QUORUM_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    digest: str
    password: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, ensemble_size: _Optional[int] = ..., write_quorum: _Optional[int] = ..., ack_quorum: _Optional[int] = ..., digest: _Optional[str] = ..., password: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("after", "limit")
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    after: int
    limit: int
    def __init__(self, after: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("ledgers", "next_after")
    LEDGERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_FIELD_NUMBER: _ClassVar[int]
    ledgers: _containers.RepeatedCompositeFieldContainer[Ledger]
    next_after: int
    def __init__(self, ledgers: _Optional[_Iterable[_Union[Ledger, _Mapping]]] = ..., next_after: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: _Optional[int] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("ledger_id", "entries")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entries: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, ledger_id: _Optional[int] = ..., entries: _Optional[_Iterable[bytes]] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("first_entry_id", "last_entry_id", "lac")
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    first_entry_id: int
    last_entry_id: int
    lac: int
    def __init__(self, first_entry_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., lac: _Optional[int] = ...) -> None: ...

class AppendStreamRequest(_message.Message):
    __slots__ = ("ledger_id", "entry")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., entry: _Optional[bytes] = ...) -> None: ...

class AppendAck(_message.Message):
    __slots__ = ("entry_id", "lac")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    entry_id: int
    lac: int
    def __init__(self, entry_id: _Optional[int] = ..., lac: _Optional[int] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("ledger_id", "from_entry_id", "to_entry_id", "unconfirmed")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    UNCONFIRMED_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    from_entry_id: int
    to_entry_id: int
    unconfirmed: bool
    def __init__(self, ledger_id: _Optional[int] = ..., from_entry_id: _Optional[int] = ..., to_entry_id: _Optional[int] = ..., unconfirmed: _Optional[bool] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("entry_id", "data", "lac")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    entry_id: int
    data: bytes
    lac: int
    def __init__(self, entry_id: _Optional[int] = ..., data: _Optional[bytes] = ..., lac: _Optional[int] = ...) -> None: ...

class EntryBatch(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ...) -> None: ...

class TailRequest(_message.Message):
    __slots__ = ("ledger_id", "from_entry_id")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    from_entry_id: int
    def __init__(self, ledger_id: _Optional[int] = ..., from_entry_id: _Optional[int] = ...) -> None: ...

class ReadLacRequest(_message.Message):
    __slots__ = ("ledger_id", "after", "timeout_ms")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    after: int
    timeout_ms: int
    def __init__(self, ledger_id: _Optional[int] = ..., after: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ReadLacResponse(_message.Message):
    __slots__ = ("lac",)
    LAC_FIELD_NUMBER: _ClassVar[int]
    lac: int
    def __init__(self, lac: _Optional[int] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: _Optional[int] = ...) -> None: ...

class RecoverRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: _Optional[int] = ...) -> None: ...

class CloseResponse(_message.Message):
    __slots__ = ("state", "last_entry_id", "length")
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    state: str
    last_entry_id: int
    length: int
    def __init__(self, state: _Optional[str] = ..., last_entry_id: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...
