"""Public test kit: simulated clusters, nemeses, history recorders and checkers."""

from quorumlog.testing.sim import (
    InvariantViolation,
    NetworkFaults,
    SimCluster,
    SimOptions,
    TraceRecorder,
    run_seed,
    run_seeds,
)

__all__ = [
    "InvariantViolation",
    "NetworkFaults",
    "SimCluster",
    "SimOptions",
    "TraceRecorder",
    "run_seed",
    "run_seeds",
]
