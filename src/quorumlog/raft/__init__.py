"""The Raft core: sans-I/O. Events in, actions out; no clock, sockets, files or globals."""
