"""Spark analytics over Quire's event stream (see README.md)."""
