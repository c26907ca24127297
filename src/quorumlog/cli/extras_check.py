"""Commands that need an optional extra say so in one line and exit 2 (no traceback)."""

from __future__ import annotations

import click

from quorumlog.errors import MissingExtraError
from quorumlog.extras import require_extra


class ExtraNotInstalledError(click.ClickException):
    """Printed as one line; exit 2, as for a usage error (the command cannot run here)."""

    exit_code = 2


def require_extra_for_command(extra: str, command: str) -> None:
    try:
        require_extra(extra, command)
    except MissingExtraError as error:
        raise ExtraNotInstalledError(str(error)) from error


__all__ = ["ExtraNotInstalledError", "require_extra_for_command"]
