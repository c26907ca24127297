"""The ledger simulator: the shipped ledger driver and protocol cores (ledger/driver.py) in
simulated clients, shipped bookies (`Bookie` on `BookieStorage`) on the byte-level
simulated disk, the bookie protocol's frames encoded and decoded on a seeded network, and
the metadata in an `InMemoryMetadataStore` behind seeded latency and lost answers.

- bookies.py: one bookie, a `SimProcess` with its own disk (crash, restart from the
  journal, halt mid-write, full disk, bit flips on reads);
- clients.py: one ledger client, a `SimProcess` running a `LedgerDriver`, its links to the
  bookies (connections that break) and its access to the metadata;
- metadata.py: the store every client shares, recording every version it stores;
- world.py: all of them on one event queue and one network;
- workload.py, nemesis.py, checks.py, runner.py: a seed's writers, recoverers and readers,
  its faults, its invariants, and running many seeds (`quorumlog sim ledger`).
"""
