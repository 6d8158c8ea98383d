"""The collector settings every service and the bench start with (shared/gc_tuning.py)."""

import gc

from shared.gc_tuning import GC_THRESHOLDS, tune_gc


def test_tune_gc_sets_the_thresholds_and_freezes_what_start_built() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
