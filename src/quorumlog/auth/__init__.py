"""Authentication and permissions (etcd's model): users with salted password hashes,
roles granting read/write on keys, key ranges, topics and admin rights, and `auth enable`.

- `model`: users, roles, permissions, password hashing;
- `matcher`: whether a user's roles grant an access (etcd's range rules);
- `commands`: the auth commands and their deterministic apply on the "kv" group's state;
- `state`: the decoded auth state a node reads, refreshed when it changes;
- `guard`: the node's checks (tokens, which right each request needs);
- `service`: the node's answers to auth commands and queries;
- `credentials` and `client`: what clients send, and the client of the auth commands.
"""
