"""The garbage collector's settings for a `quorumlog node` process.

A node hosting a thousand partitions keeps a large heap of long-lived objects (every group's
core, log, progress, host and state machine) and allocates millions of short-lived ones
(messages, Readies, frames, completions) that form no reference cycles. Under CPython's
defaults (700, 10, 10) the young generation is collected every 700 net allocations and the
whole heap is walked whenever a quarter more objects have survived into the old generation
than at the last full collection. Measured on three nodes hosting 1,000 partitions while one
producer sent 1,000,000 records: 25-28 full collections per node, 0.1-0.2 s of CPU each
(pauses up to 0.44 s of wall time on the loaded machine, while the node answers nothing),
3.3-4.4 s of CPU per node, plus 1.3-1.5 s of young collections: about a fifth of the node's
CPU. None of those full collections found garbage.

So the node process:

- freezes what it holds once it has started (`gc.freeze`: the imported modules, its
  settings, the groups it opened). Those objects live as long as the process; the collector
  never scans them again. A frozen object freed later by its reference count is still freed;
  only a cycle among frozen objects would stay (none is made at start: a group's objects are
  released by `close`, not by the collector);
- collects the young generation every `YOUNG_THRESHOLD` net allocations and the older ones
  `OLDER_THRESHOLDS` times less often, so the short-lived objects die by reference count
  before a collection sees them and the long-lived heap is walked rarely.

Cycles are still collected, in larger batches. Only the `quorumlog node` command applies
this: nodes started inside a test process share that process's collector.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Net allocations between young collections (CPython's default: 700)."""
OLDER_THRESHOLDS = (20, 20)
"""Young collections per middle one, middle ones per full one (CPython's: 10, 10)."""


def apply_node_collector_policy() -> None:
    """Freeze what the started node holds and set the thresholds. Called once, when the
    node has started (`run_node`'s `started`): a command whose node never starts (a test of
    its flags) leaves the process's collector alone."""
    freeze_started_state()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)


def freeze_started_state() -> None:
    """Move everything alive now out of the collector's reach."""
    gc.collect()  # what start-up left as garbage goes now, not into the frozen set
    gc.freeze()


__all__ = [
    "OLDER_THRESHOLDS",
    "YOUNG_THRESHOLD",
    "apply_node_collector_policy",
    "freeze_started_state",
]
