"""The recording test action reads only whole records: with two replicas appending to one
file, a read met the other's line half written and failed the step with a JSON error (a
replica test then waited in vain for its 200th run)."""

from __future__ import annotations

import json
import pathlib

from tests.support import recording


def test_a_line_being_written_is_not_read_yet(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "records.jsonl"
    whole = [{"kind": "apply", "key": "a"}, {"kind": "start", "key": "b"}]
    text = "".join(json.dumps(record) + "\n" for record in whole)
    path.write_text(text + json.dumps({"kind": "apply", "key": "b"})[:20])
    assert recording.read_records(path) == whole
    path.write_text(text)
    assert recording.read_records(path) == whole
