"""The broker's garbage collector policy (relay/broker/collector.py)."""

import gc

from relay.broker import collector


def test_the_survivors_of_a_full_collection_are_frozen():
    gc.unfreeze()
    thresholds = gc.get_threshold()
    collector.install()
    collector.install()     # once per process, however often called
    try:
        assert gc.callbacks.count(collector._freeze_survivors) == 1
        assert gc.get_threshold() == (100_000, 50, 100)  # young: every 100,000 allocations
        gc.collect()
        assert gc.get_freeze_count() > 0
        frozen = gc.get_freeze_count()
        gc.collect(0)       # a young collection freezes nothing
        assert gc.get_freeze_count() == frozen
    finally:
        gc.callbacks.remove(collector._freeze_survivors)
        gc.unfreeze()
        gc.set_threshold(*thresholds)
