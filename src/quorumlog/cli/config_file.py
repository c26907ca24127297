"""Every flag of a long-running command also from the environment and from a TOML file.

`quorumlog node` (and `quorumlog bookie`) take each option three more ways, in this order
of precedence:

1. the flag on the command line;
2. the environment: `QUORUMLOG_<FLAG>`, the flag's long name in upper case with dashes as
   underscores (`--data-dir` is `QUORUMLOG_DATA_DIR`; a repeatable flag takes its values
   separated by spaces);
3. the file named by `--config-file` (or `$QUORUMLOG_CONFIG_FILE`), TOML, one key per flag:
   the flag's long name without its dashes, with `-` or `_` (`data-dir = "..."` or
   `data_dir = "..."`; a flag that takes no value is `true` or `false`; a repeatable one
   a list);
4. the flag's default.

It is built from the command's own parameters (`ConfiguredCommand`), so a flag added to the
command is covered without touching this module. Click does the precedence itself (command
line, environment, then the context's `default_map`, then the default): the file is read
by an eager option into `default_map`, and every value is handed to click as the text a
flag would carry, so a wrong value gets the error the flag would.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from typing import Any

import click

ENVIRONMENT_PREFIX = "QUORUMLOG"
CONFIG_FILE_OPTION = "config_file"

PRECEDENCE_HELP = (
    "Every option can also be set as the environment variable QUORUMLOG_<OPTION> (upper "
    "case, dashes as underscores: --data-dir is QUORUMLOG_DATA_DIR) or in the TOML file "
    'given by --config-file (a key per option, without its dashes: data-dir = "..."; '
    "flags are true or false; repeatable options are lists). A flag beats the "
    "environment, which beats the file, which beats the default."
)


class ConfigFileError(click.ClickException):
    """A config file that cannot be used: said in one line, exit 2 (as a usage error)."""

    exit_code = 2


def long_names(option: click.Option) -> list[str]:
    """The option's long flag names without dashes (`--no-fsync` → `no-fsync`)."""
    return [name[2:] for name in option.opts if name.startswith("--")]


def environment_variable(option: click.Option) -> str:
    return f"{ENVIRONMENT_PREFIX}_{long_names(option)[0].upper().replace('-', '_')}"


def normalized(key: str) -> str:
    return key.replace("_", "-").lower()


def configurable_options(command: click.Command) -> dict[str, click.Option]:
    """Normalized file key → option, for every option a file may set."""
    keys: dict[str, click.Option] = {}
    for parameter in command.params:
        if not isinstance(parameter, click.Option) or parameter.name == CONFIG_FILE_OPTION:
            continue
        if parameter.is_eager or not parameter.expose_value:
            continue  # --help, --version: not settings
        for name in long_names(parameter):
            keys[normalized(name)] = parameter
    return keys


def as_flag_text(option: click.Option, key: str, value: Any) -> str | list[str]:
    """The TOML value as the text the flag would carry, so click checks it as it checks
    the flag (a float given to an integer flag is refused, not truncated)."""
    if isinstance(value, dict):
        raise ConfigFileError(f"config file key {key!r} is a table; --{key} takes a value")
    if isinstance(value, list):
        if not option.multiple:
            raise ConfigFileError(f"config file key {key!r} is a list; --{key} takes one value")
        return [scalar_text(key, item) for item in value]
    text = scalar_text(key, value)
    return [text] if option.multiple else text


def scalar_text(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        raise ConfigFileError(f"config file key {key!r} holds a nested value")
    return str(value)


def read_config_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except OSError as error:
        raise ConfigFileError(f"cannot read config file {path}: {error.strerror}") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigFileError(f"config file {path} is not valid TOML: {error}") from error


def config_default_map(
    command: click.Command, path: str, values: Mapping[str, Any]
) -> dict[str, Any]:
    """Parameter name → value for click's `default_map`; unknown keys refused together."""
    options = configurable_options(command)
    unknown = sorted(key for key in values if normalized(key) not in options)
    if unknown:
        hints = [
            f"{key} (did you mean {close[0]}?)" if close else key
            for key in unknown
            for close in [difflib.get_close_matches(normalized(key), list(options), n=1)]
        ]
        raise ConfigFileError(
            f"config file {path}: unknown key{'s' if len(unknown) > 1 else ''}: {', '.join(hints)}"
        )
    default_map: dict[str, Any] = {}
    for key, value in values.items():
        option = options[normalized(key)]
        if option.name in default_map:
            raise ConfigFileError(f"config file {path}: {option.opts[0]} is set twice")
        default_map[str(option.name)] = as_flag_text(option, normalized(key), value)
    return default_map


def load_config_file(context: click.Context, parameter: click.Parameter, value: str | None) -> None:
    """Eager: runs before the other options take their values, so they see the file."""
    if not value or context.resilient_parsing:
        return
    values = read_config_file(value)
    context.default_map = {
        **(context.default_map or {}),
        **config_default_map(context.command, value, values),
    }


def config_file_option() -> click.Option:
    return click.Option(
        ["--config-file"],
        type=click.Path(dir_okay=False),
        envvar=f"{ENVIRONMENT_PREFIX}_CONFIG_FILE",
        show_envvar=True,
        is_eager=True,
        expose_value=False,
        callback=load_config_file,
        help="A TOML file with any of these options (see below for precedence).",
    )


def make_configurable(command: click.Command) -> None:
    """Give each option its environment variable (those that name their own keep it), add
    --config-file, and say the precedence at the end of the help."""
    for parameter in command.params:
        if isinstance(parameter, click.Option) and not parameter.is_eager and long_names(parameter):
            if not parameter.envvar:
                parameter.envvar = environment_variable(parameter)
            parameter.show_envvar = True
    command.params.append(config_file_option())
    command.epilog = "\n\n".join(filter(None, [command.epilog, PRECEDENCE_HELP]))


class ConfiguredCommand(click.Command):
    """A command whose options also come from `QUORUMLOG_*` and `--config-file`."""

    def __init__(self, *arguments: Any, **settings: Any) -> None:
        super().__init__(*arguments, **settings)
        make_configurable(self)


class ConfiguredGroup(click.Group):
    """`ConfiguredCommand` for a group that also runs by itself (`quorumlog bookie`)."""

    def __init__(self, *arguments: Any, **settings: Any) -> None:
        super().__init__(*arguments, **settings)
        make_configurable(self)


def environment_names(command: click.Command) -> dict[str, str]:
    """Option name → its environment variable (for documentation and tests)."""
    return {
        str(parameter.name): str(parameter.envvar)
        for parameter in command.params
        if isinstance(parameter, click.Option) and isinstance(parameter.envvar, str)
    }


__all__ = [
    "PRECEDENCE_HELP",
    "ConfigFileError",
    "ConfiguredCommand",
    "ConfiguredGroup",
    "config_default_map",
    "configurable_options",
    "environment_names",
]
