"""The controller-mode simulator (reference 003): the shipped HA controller machine and
service on the Raft simulator, brokers running the shipped `BrokerHost` and cores on
simulated disks, a producer, seeded faults and the invariants of checks.py."""
