"""The consumer-group coordinator in the simulator: the shipped machine and service on a
simulated Raft group, consumers running the shipped membership decisions, and checks of
what Kafka users trust it for (world.py, checks.py, runner.py)."""
