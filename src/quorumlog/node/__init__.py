"""The node process: one listener, one transport, and the Raft groups it hosts."""
