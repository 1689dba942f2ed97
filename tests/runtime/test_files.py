"""Atomic writes: the whole file or the old one, with the permissions a plain write would give."""
from __future__ import annotations

import os
import stat

import pytest

from llm_marl.files import current_umask, write_file_atomically, write_text_atomically


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_file_gets_the_umask_mode_not_the_temp_files(tmp_path):
    old = os.umask(0o022)
    try:
        assert current_umask() == 0o022
        written = write_text_atomically(tmp_path / "results.json", "{}")
        plain = tmp_path / "plain.json"
        plain.write_text("{}")
    finally:
        os.umask(old)
    assert written.read_text() == "{}"
    assert mode_of(written) == mode_of(plain) == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []     # no temp file left


def test_replacing_a_file_keeps_its_mode(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text("old")
    os.chmod(path, 0o750)
    write_text_atomically(path, "new")
    assert path.read_text() == "new" and mode_of(path) == 0o750


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("old")

    def fail(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_file_atomically(path, fail)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
