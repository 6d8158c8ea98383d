"""`quire bench`: Quire's write path measured end to end, optionally beside JetStream."""
