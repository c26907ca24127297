"""Users, roles and permissions, as the replicated state holds them (etcd's auth model).

- A user has a name, a salted slow password hash (PBKDF2-HMAC-SHA256 with a per-user
  random salt; the password itself is never stored, nor written to the log) and roles.
- A role has permissions. A permission grants read, write or readwrite on keys or on
  topics, by etcd's range rules (`range_end`): "" is the one key `key`; "\\0" is every key
  from `key` on; anything else is the half-open range [key, range_end) (a prefix P is the
  range [P, prefix_end(P))). Admin permissions name a right: "membership" (member add,
  remove, promote, leader transfer, shard controller changes), "topics" (create and
  delete topics) or "auth" (users, roles, enable, disable).
- The role "root" is built in: it grants everything, and a user "root" holding it must
  exist before auth is enabled (so someone can always switch it off again).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os

import msgspec

ROOT_USER = "root"
ROOT_ROLE = "root"
NODE_USER = "__node"
"""The identity nodes use for their own requests to each other (see `auth.guard`); no
user may be created with a name starting "__"."""
PASSWORD_ITERATIONS_DEFAULT = 100_000
"""PBKDF2 rounds: about 50 ms of one core per hash, paid once per connection."""
SALT_BYTES = 16
NAME_CHARACTERS_MAX = 256
FROM_KEY = "\0"
"""`range_end` meaning "every key (or topic) from `key` on" (etcd's --from-key)."""


class PermissionKind(enum.Enum):
    KEY = "key"
    TOPIC = "topic"
    ADMIN = "admin"


class Access(enum.Enum):
    READ = "read"
    WRITE = "write"
    READWRITE = "readwrite"

    def covers(self, wanted: Access) -> bool:
        return self is Access.READWRITE or self is wanted


class AdminRight(enum.Enum):
    MEMBERSHIP = "membership"
    TOPICS = "topics"
    AUTH = "auth"


class Permission(msgspec.Struct, frozen=True):
    kind: PermissionKind
    access: Access
    key: str
    """A key or topic name (the start of a range); for ADMIN, an `AdminRight` value."""
    range_end: str = ""


class Role(msgspec.Struct, frozen=True):
    name: str
    permissions: list[Permission] = []


class PasswordHash(msgspec.Struct, frozen=True):
    salt_hex: str
    hash_hex: str
    iterations: int


class User(msgspec.Struct, frozen=True):
    name: str
    password: PasswordHash
    roles: list[str] = []


class AuthSwitch(msgspec.Struct, frozen=True):
    enabled: bool
    node_secret: str = ""
    """Chosen at random by the leader that took `auth enable`: nodes present it to each
    other as the password of `NODE_USER` (every node holds the replicated state)."""


def prefix_range_end(prefix: str) -> str:
    """The range end of every key starting with `prefix`; FROM_KEY for the empty prefix
    (every key). Like etcd's, for a prefix whose last character is the largest one this
    would not be a range; such a prefix is refused by `check_name`'s callers."""
    if not prefix:
        return FROM_KEY
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def check_name(what: str, name: str) -> str | None:
    """Why `name` cannot name a user or role; None if it can."""
    if not name:
        return f"a {what} needs a name"
    if len(name) > NAME_CHARACTERS_MAX:
        return f"a {what} name has at most {NAME_CHARACTERS_MAX} characters"
    if name.startswith("__"):
        return f"{what} names starting with '__' are reserved"
    if any(character in name for character in ":/\0") or not name.isprintable():
        return f"{what} name {name!r} may not hold ':', '/', NUL or unprintable characters"
    return None


def hash_password(
    password: str, iterations: int = PASSWORD_ITERATIONS_DEFAULT, salt: bytes | None = None
) -> PasswordHash:
    """A new salted hash of `password` (a fresh random salt unless one is given). Done at
    the node that takes the request, before anything is proposed: the log holds this."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return PasswordHash(salt_hex=salt.hex(), hash_hex=digest.hex(), iterations=iterations)


def verify_password(password: str, stored: PasswordHash) -> bool:
    try:
        salt = bytes.fromhex(stored.salt_hex)
        expected = bytes.fromhex(stored.hash_hex)
    except ValueError:
        return False
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, stored.iterations)
    return hmac.compare_digest(digest, expected)


__all__ = [
    "FROM_KEY",
    "NODE_USER",
    "ROOT_ROLE",
    "ROOT_USER",
    "Access",
    "AdminRight",
    "AuthSwitch",
    "PasswordHash",
    "Permission",
    "PermissionKind",
    "Role",
    "User",
    "check_name",
    "hash_password",
    "prefix_range_end",
    "verify_password",
]
