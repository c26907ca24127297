"""The `quorumlog` command."""
