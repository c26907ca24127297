"""The node process's collector policy (node/gc_policy.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from quorumlog.node.gc_policy import (
    OLDER_THRESHOLDS,
    YOUNG_THRESHOLD,
    apply_node_collector_policy,
    freeze_started_state,
)


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_collector")
def test_the_policy_collects_young_objects_in_larger_batches() -> None:
    apply_node_collector_policy()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    assert gc.get_freeze_count() > 0
    assert YOUNG_THRESHOLD > 700  # CPython's default, which the policy exists to replace


@pytest.mark.usefixtures("restored_collector")
def test_freezing_takes_what_lives_out_of_later_collections_and_leaves_garbage_out() -> None:
    class Cell:
        other: Cell | None = None

    kept = Cell()
    garbage, partner = Cell(), Cell()
    garbage.other, partner.other = partner, garbage  # a cycle nothing refers to
    garbage_ref = weakref.ref(garbage)
    del garbage, partner
    freeze_started_state()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    assert gc.is_tracked(kept)
    # The cycle was collected before the freeze, not kept forever in the frozen set.
    assert garbage_ref() is None
    gc.collect()
    assert gc.get_freeze_count() == frozen  # a full collection leaves the frozen set alone
