"""The deterministic simulator: the real gateway protocol cores and the real bookie ledger
state under seeded faults (`python -m quire.sim --seeds N`)."""
