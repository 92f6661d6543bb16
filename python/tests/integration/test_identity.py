"""Identity that is never reused: a version number names one content for the table's whole life (a dropped
version's number is not given out again), and a table created again under the same name is another table (a new
incarnation id). DESCRIBE reports both, with the table's durability."""

from __future__ import annotations

import numpy as np
import pytest

import ramgrid

pytestmark = pytest.mark.timeout(60)


def test_a_dropped_versions_number_is_never_given_out_again(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=8, replication=2, value_type="f64")
    keys = np.arange(100)
    with t.new_version() as v:
        v.put_many(keys, np.full(100, 2.0))
    assert t.current_version() == 2
    # A load that fails: its version (3) is dropped and version 2 stays current.
    with pytest.raises(RuntimeError), t.new_version() as v:
        v.put_many(keys, np.full(100, 3.0))
        raise RuntimeError("load failed")
    assert t.current_version() == 2
    assert t.describe()["high_water"] == 3
    with t.new_version() as v:
        assert v.version == 4, "number 3 named the failed load's contents: it is not given out again"
        v.put_many(keys, np.full(100, 4.0))
    assert np.array_equal(t.get_many(keys), np.full(100, 4.0))
    assert [x["version"] for x in t.versions()] == [1, 2, 4]


def test_a_table_created_again_is_another_incarnation(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    t = grid3.create_table(table_name, partitions=4, value_type="i64", durability="snapshot")
    first = t.describe()
    assert first["durability"] == "snapshot"
    assert first["incarnation"] != 0
    with t.new_version() as v:
        v.put_many(np.arange(10), np.arange(10))
    grid3.drop_table(table_name)
    t = grid3.create_table(table_name, partitions=4, value_type="i64")
    again = t.describe()
    assert again["incarnation"] != first["incarnation"]
    assert again["durability"] == "memory"
    assert (again["current_version"], again["high_water"]) == (1, 1)


def test_an_unknown_durability_is_refused(grid3: ramgrid.LocalGrid, table_name: str) -> None:
    with pytest.raises(ValueError, match="durability"):
        grid3.create_table(table_name, durability="disk")
    assert table_name not in grid3.tables()
