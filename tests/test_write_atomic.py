"""write_atomic: a file written whole or not at all, also by two writers of the same file at
once (two jobs building one shared cache entry, as two experiments of a campaign do)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from servelab.store.jsonio import write_atomic, write_json


def test_two_writers_of_one_file_never_take_each_others_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "servelab-model.json"
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def writer(n: int) -> None:
        start.wait()
        try:
            for i in range(300):
                write_json(path, {"writer": n, "i": i, "pad": "x" * 4096})
        except BaseException as exc:  # a FileNotFoundError when both used one temp name
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    last = json.loads(path.read_text())
    assert last["writer"] in (1, 2) and last["i"] == 299  # whole: one writer's last write
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left


def test_text_and_bytes_are_written_whole(tmp_path: Path) -> None:
    write_atomic(tmp_path / "a.txt", "é\n")
    write_atomic(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "a.txt").read_bytes() == "é\n".encode()
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
