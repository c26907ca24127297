"""Public test kit: simulated clusters, nemeses, history recorders and checkers.

Users test their own state machines and clients with the same tools quorumlog's own tests
use: `SimCluster` runs the shipped Raft host on virtual time under seeded faults, with the
shipped KV machine and service by default or any state machine a `SimApplication` names;
`History` records concurrent operations, `check_linearizable` and `check_queue` judge them.
For scripted tests of a state machine on the shipped `RaftHost`, `ManualScheduler` moves
time only when the test says so and `InlineBackground` runs disk work on the test's thread.
"""

from quorumlog.testing.history import History, HistoryError, Operation, OperationStatus
from quorumlog.testing.linearizability import (
    KV_MODEL,
    REGISTER_MODEL,
    LinearizabilityResult,
    Model,
    check_linearizable,
)
from quorumlog.testing.manual import InlineBackground, ManualScheduler, ManualTimer
from quorumlog.testing.queue_checker import (
    ConsumedRecord,
    ProducedRecord,
    ProduceStatus,
    QueueCheckResult,
    check_queue,
)
from quorumlog.testing.sim import (
    InvariantViolation,
    NetworkFaults,
    SimApplication,
    SimCluster,
    SimOptions,
    TraceRecorder,
    run_seed,
    run_seeds,
)

__all__ = [
    "KV_MODEL",
    "REGISTER_MODEL",
    "ConsumedRecord",
    "History",
    "HistoryError",
    "InlineBackground",
    "InvariantViolation",
    "LinearizabilityResult",
    "ManualScheduler",
    "ManualTimer",
    "Model",
    "NetworkFaults",
    "Operation",
    "OperationStatus",
    "ProduceStatus",
    "ProducedRecord",
    "QueueCheckResult",
    "SimApplication",
    "SimCluster",
    "SimOptions",
    "TraceRecorder",
    "check_linearizable",
    "check_queue",
    "run_seed",
    "run_seeds",
]
