"""The auth state as a node reads it: decoded from the "kv" group's data once per change.

The KV machine counts changes of the auth state (`auth_generation`); `AuthStateView`
decodes the state again only when that count moved, and keeps each user's compiled
`Rights` until then, so a request's check is a few dictionary lookups.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import msgspec

from quorumlog.auth.commands import AUTH_PREFIX, read_roles, read_switch, read_users
from quorumlog.auth.matcher import Rights
from quorumlog.auth.model import AuthSwitch, Role, User

log = logging.getLogger("quorumlog.auth")


class AuthState:
    """One decoded version of the auth state."""

    def __init__(self, users: dict[str, User], roles: dict[str, Role], switch: AuthSwitch) -> None:
        self.users = users
        self.roles = roles
        self.switch = switch
        self.enabled = switch.enabled
        self.rights_cache: dict[str, Rights] = {}

    @classmethod
    def from_data(cls, data: Mapping[str, str]) -> AuthState:
        """The state as stored; if it does not decode (written as plain keys while auth
        was off, before the KV refused "__" keys), the state with auth off, logged: a
        node must not stop over bytes a client could write."""
        try:
            return cls(read_users(data), read_roles(data), read_switch(data))
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            log.error(
                "the auth state under %r does not decode (%s): auth stays off", AUTH_PREFIX, error
            )
            return cls({}, {}, AuthSwitch(enabled=False))

    def rights_of(self, user_name: str) -> Rights | None:
        """What `user_name` may do now; None if there is no such user."""
        rights = self.rights_cache.get(user_name)
        if rights is not None:
            return rights
        user = self.users.get(user_name)
        if user is None:
            return None
        rights = Rights(self.roles.values(), user.roles)
        self.rights_cache[user_name] = rights
        return rights


class AuthStateView:
    """The current `AuthState` of one KV machine."""

    def __init__(
        self, data: Callable[[], Mapping[str, str]], generation: Callable[[], int]
    ) -> None:
        self.data = data
        self.generation = generation
        self.seen_generation = -1
        self.state = AuthState({}, {}, AuthSwitch(enabled=False))

    def current(self) -> AuthState:
        generation = self.generation()
        if generation != self.seen_generation:
            self.state = AuthState.from_data(self.data())
            self.seen_generation = generation
        return self.state

    def enabled(self) -> bool:
        """The hot path's one check while auth is off."""
        return self.current().enabled


__all__ = ["AuthState", "AuthStateView"]
