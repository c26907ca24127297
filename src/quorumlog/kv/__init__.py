"""The replicated key-value store: state machine, client sessions, clients."""
