"""The results store on its own: whole lines only, a torn tail cut before the next point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ct200_tools.bench.results import Store, read_lines
from ct200_tools.untrusted import UntrustedInputError


def test_a_torn_last_line_is_ignored_and_cut_before_the_next_point(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.add_point({"key": "a"})
    with store.results.open("ab") as fh:
        fh.write(b'{"key": "b", "dur')  # a machine crash mid-write
    seen = read_lines(store.results)
    assert seen.torn and seen.records == [{"key": "a"}]
    assert store.repair_tail() == len(b'{"key": "b", "dur')
    store.add_point({"key": "c"})
    assert [json.loads(x) for x in store.results.read_text().splitlines()] == [
        {"key": "a"},
        {"key": "c"},
    ]
    assert store.repair_tail() == 0


def test_a_whole_file_of_one_torn_line_is_cut_to_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.results.write_bytes(b"x" * 100_000)
    assert store.repair_tail() == 100_000 and store.results.read_bytes() == b""


def test_a_line_that_is_not_a_point_is_an_error_naming_it(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.results.write_text('{"key": "a"}\n[1, 2]\n')
    with pytest.raises(UntrustedInputError) as err:
        store.points()
    assert "line 2" in err.value.message and err.value.fix
