"""The demo's Spark tests use the session of tests/spark: one per test process, whoever
asks first, so the two directories never stop (or reconfigure) each other's session."""

from tests.spark.conftest import spark  # noqa: F401 - a fixture, found here by name
