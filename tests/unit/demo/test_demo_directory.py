"""The demo resets only a directory that is empty or its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumlog.demo.cluster import MARKER_FILE, DemoDirectoryError, reset_demo_directory


def test_a_missing_directory_is_created_and_marked(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    reset_demo_directory(directory)
    assert sorted(path.name for path in directory.iterdir()) == [".gitignore", MARKER_FILE]


def test_a_previous_run_is_cleared(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    reset_demo_directory(directory)
    (directory / "cluster").mkdir()
    (directory / "cluster" / "n1.log").write_text("old")
    reset_demo_directory(directory)
    assert sorted(path.name for path in directory.iterdir()) == [".gitignore", MARKER_FILE]


def test_someone_elses_directory_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("precious")
    with pytest.raises(DemoDirectoryError, match="not made by `quorumlog demo`"):
        reset_demo_directory(tmp_path)
    assert (tmp_path / "thesis.tex").read_text() == "precious"


def test_an_empty_directory_is_taken(tmp_path: Path) -> None:
    reset_demo_directory(tmp_path)
    assert (tmp_path / MARKER_FILE).exists()
