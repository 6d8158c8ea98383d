"""Plain-Python references ("oracles") of the SLA tables: each `<table>(events, options)` takes
the events as dicts (the published JSON, deduplicated on event_id, before `until`) and returns
the table's rows as dicts, computed per event and per entry, independently of the Spark code.
Times in the rows are milliseconds since the epoch (ints); the tests compare Spark's rows
with these."""
