"""`quorumlog node` options from flags, QUORUMLOG_* and --config-file, in that order.

The real command runs through click's CliRunner; only `run_node` is replaced, by one that
keeps the settings the command built instead of starting a node."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from quorumlog.cli.bookie_commands import bookie_group
from quorumlog.cli.config_file import ConfiguredCommand, configurable_options
from quorumlog.cli.node_commands import node_command
from quorumlog.node import server
from quorumlog.node.server import NodeSettings

REQUIRED = ["--id", "n1", "--listen", "127.0.0.1:0", "--data-dir", "unused"]


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[NodeSettings]:
    kept: list[NodeSettings] = []

    async def keep_settings(
        settings: NodeSettings, stop: asyncio.Event, *_: Any, **__: Any
    ) -> None:
        kept.append(settings)

    monkeypatch.setattr(server, "run_node", keep_settings)
    return kept


def run(arguments: list[str], environment: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(node_command, arguments, env=environment or {})


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_flag_beats_environment_beats_file_beats_default(
    tmp_path: Path, started: list[NodeSettings]
) -> None:
    config = write(
        tmp_path / "node.toml",
        "tick-ms = 70\nsnapshot-entries = 700\nshard_count = 7\n",
    )
    environment = {"QUORUMLOG_TICK_MS": "60", "QUORUMLOG_SNAPSHOT_ENTRIES": "600"}
    result = run([*REQUIRED, "--config-file", config, "--tick-ms", "80"], environment)
    assert result.exit_code == 0, result.output
    settings = started[-1]
    assert settings.tick_ms == 80  # flag over environment and file
    assert settings.snapshot_entries == 600  # environment over file
    assert settings.shard_count == 7  # file over default
    assert settings.quiesce_idle_ticks == 4  # default


def test_every_flag_can_come_from_the_file(tmp_path: Path, started: list[NodeSettings]) -> None:
    config = write(
        tmp_path / "node.toml",
        'id = "n2"\nlisten = "127.0.0.1:0"\ndata-dir = "d"\npeers = "n1=127.0.0.1:1"\n'
        "no-fsync = true\njoin = false\n"
        'controller = "n1,n2"\nshard-group = ["1=n1,n2", "2=n2"]\n',
    )
    result = run(["--config-file", config])
    assert result.exit_code == 0, result.output
    settings = started[-1]
    assert (settings.node_id, settings.data_dir, settings.fsync) == ("n2", "d", False)
    assert settings.peers == {"n1": "127.0.0.1:1"}
    assert settings.shard_groups == {1: ["n1", "n2"], 2: ["n2"]}


def test_config_file_from_the_environment(tmp_path: Path, started: list[NodeSettings]) -> None:
    config = write(tmp_path / "node.toml", "tick-ms = 30\n")
    result = run(REQUIRED, {"QUORUMLOG_CONFIG_FILE": config, "QUORUMLOG_NO_FSYNC": "1"})
    assert result.exit_code == 0, result.output
    assert (started[-1].tick_ms, started[-1].fsync) == (30, False)


def test_unknown_keys_are_refused_in_one_line_naming_them(
    tmp_path: Path, started: list[NodeSettings]
) -> None:
    config = write(tmp_path / "node.toml", "tick-ms = 30\ntick_msec = 1\ncolour = 'red'\n")
    result = run([*REQUIRED, "--config-file", config])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "colour" in lines[0] and "tick_msec" in lines[0] and "did you mean tick-ms" in lines[0]
    assert not started


@pytest.mark.parametrize(
    ("toml_value", "flag_value"), [('"fast"', "fast"), ("1.5", "1.5"), ("0", "0")]
)
def test_a_wrong_value_gets_the_error_the_flag_gets(
    tmp_path: Path, started: list[NodeSettings], toml_value: str, flag_value: str
) -> None:
    from_flag = run([*REQUIRED, "--tick-ms", flag_value])
    config = write(tmp_path / "node.toml", f"tick-ms = {toml_value}\n")
    from_file = run([*REQUIRED, "--config-file", config])
    assert from_flag.exit_code == from_file.exit_code == 2
    assert from_file.output.splitlines()[-1] == from_flag.output.splitlines()[-1]
    assert "--tick-ms" in from_file.output
    assert not started


def test_a_table_or_a_list_for_a_single_value_is_refused(tmp_path: Path) -> None:
    for text in ("tick-ms = [1, 2]\n", "[tick-ms]\nvalue = 1\n"):
        result = run([*REQUIRED, "--config-file", write(tmp_path / "node.toml", text)])
        assert result.exit_code == 2
        assert "tick-ms" in result.output


def test_unreadable_or_invalid_file_says_so(tmp_path: Path) -> None:
    missing = run([*REQUIRED, "--config-file", str(tmp_path / "absent.toml")])
    invalid = run([*REQUIRED, "--config-file", write(tmp_path / "bad.toml", "tick-ms = \n")])
    assert missing.exit_code == invalid.exit_code == 2
    assert "absent.toml" in missing.output
    assert "not valid TOML" in invalid.output


def test_every_node_option_has_its_environment_variable_and_file_key() -> None:
    options = configurable_options(node_command)
    for parameter in node_command.params:
        if not isinstance(parameter, click.Option) or parameter.name == "config_file":
            continue
        flag = next(name for name in parameter.opts if name.startswith("--"))
        assert parameter.envvar == "QUORUMLOG_" + flag[2:].upper().replace("-", "_")
        assert options[flag[2:]] is parameter


def test_an_option_added_later_is_covered_without_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, str]] = []

    @click.command(cls=ConfiguredCommand)
    @click.option("--new-limit-bytes", type=int, default=1)
    @click.option("--new-name", default="x")
    def command(new_limit_bytes: int, new_name: str) -> None:
        seen.append((new_limit_bytes, new_name))

    config = write(tmp_path / "c.toml", 'new_limit_bytes = 5\nnew-name = "file"\n')
    result = CliRunner().invoke(
        command, ["--config-file", config], env={"QUORUMLOG_NEW_NAME": "environment"}
    )
    assert result.exit_code == 0, result.output
    assert seen == [(5, "environment")]


def test_help_documents_the_precedence() -> None:
    text = " ".join(run(["--help"]).output.split())
    assert "QUORUMLOG_DATA_DIR" in text and "--config-file" in text
    assert "A flag beats the environment, which beats the file, which beats the default" in text


def test_bookie_takes_a_config_file_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import quorumlog.cli.bookie_commands as bookie_commands

    kept: list[Any] = []
    monkeypatch.setattr(bookie_commands, "run_bookie_process", kept.append)
    config = write(
        tmp_path / "bookie.toml",
        'id = "b1"\nlisten = "127.0.0.1:0"\ndata-dir = "d"\nmetadata = "127.0.0.1:1"\n',
    )
    result = CliRunner().invoke(
        bookie_group, ["--config-file", config], env={"QUORUMLOG_HEARTBEAT_MS": "250"}
    )
    assert result.exit_code == 0, result.output
    assert (kept[0].bookie_id, kept[0].heartbeat_ms) == ("b1", 250)


# --- election timeout and heartbeat interval ------------------------------------------


def test_timing_flags_become_ticks(started: list[NodeSettings]) -> None:
    timing = ["--tick-ms", "20", "--heartbeat-interval-ms", "40", "--election-timeout-ms", "400"]
    result = run([*REQUIRED, *timing])
    assert result.exit_code == 0, result.output
    assert (started[-1].heartbeat_ticks, started[-1].election_ticks) == (2, 20)
    assert run(REQUIRED).exit_code == 0
    assert (started[-1].heartbeat_ticks, started[-1].election_ticks) == (1, 10)


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        (["--heartbeat-interval-ms", "100", "--election-timeout-ms", "400"], "at least 5 times"),
        (["--heartbeat-interval-ms", "75"], "whole multiple of --tick-ms"),
        (["--election-timeout-ms", "20"], "whole multiple of --tick-ms"),
        (["--election-timeout-ms", "60000"], "over 50000 ms"),
    ],
)
def test_unsafe_timing_is_refused(
    started: list[NodeSettings], arguments: list[str], complaint: str
) -> None:
    result = run([*REQUIRED, "--tick-ms", "50", *arguments])
    assert result.exit_code == 2
    assert complaint in result.output
    assert not started
