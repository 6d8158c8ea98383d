"""The durability SLA jobs: Spark over the event stream, Parquet tables and a report."""
