"""BookKeeper-style ledgers (reference 001): bookies, the ledger client, managed ledgers."""
