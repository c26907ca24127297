"""BookKeeper-style ledgers (reference 001): ledger metadata, the client protocol, bookies."""
