"""Controller mode (reference 003): the HA controller, master/slave replication, epoch files."""
