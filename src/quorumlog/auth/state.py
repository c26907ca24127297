"""The auth state as a node reads it: decoded from the "kv" group's data once per change.

The KV machine counts changes of the auth state (`auth_generation`); `AuthStateView`
decodes the state again only when that count moved, and keeps each user's compiled
`Rights` until then, so a request's check is a few dictionary lookups.
"""

from __future__ import annotations

from collections.abc import Callable

from quorumlog.auth.commands import read_roles, read_switch, read_users
from quorumlog.auth.matcher import Rights
from quorumlog.auth.model import AuthSwitch, Role, User


class AuthState:
    """One decoded version of the auth state."""

    def __init__(self, users: dict[str, User], roles: dict[str, Role], switch: AuthSwitch) -> None:
        self.users = users
        self.roles = roles
        self.switch = switch
        self.enabled = switch.enabled
        self.rights_cache: dict[str, Rights] = {}

    @classmethod
    def from_data(cls, data: dict[str, str]) -> AuthState:
        return cls(read_users(data), read_roles(data), read_switch(data))

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

    def __init__(self, data: Callable[[], dict[str, str]], generation: Callable[[], int]) -> None:
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
