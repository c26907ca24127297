"""Benchmarks behind `quorumlog bench ...`; they print figures and never decide pass or fail."""
