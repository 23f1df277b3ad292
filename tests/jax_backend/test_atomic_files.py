"""The one temp-then-rename writer (``jax_backend.atomic_files``): a failure before the
rename leaves the old file (or directory) and no temporary; a publish replaces it whole."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from jax_backend import atomic_files


class Interrupted(Exception):
    pass


def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"old contents")
    with pytest.raises(Interrupted), atomic_files.AtomicFile(path) as new:
        os.write(new.fd, b"half of the new")
        assert os.path.exists(new.temp_path)
        raise Interrupted
    assert path.read_bytes() == b"old contents"
    assert sorted(os.listdir(tmp_path)) == ["data.bin"]


def test_write_file_replaces_the_file_whole_with_the_mode_asked_for(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"old contents")
    atomic_files.write_file(path, b"new", mode=0o600)
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["data.bin"]


def test_a_failing_rename_in_write_file_removes_the_temporary(tmp_path):
    path = tmp_path / "data.bin"
    path.mkdir()  # a directory: os.replace of a file onto it fails
    with pytest.raises(IsADirectoryError):
        atomic_files.write_file(path, b"new")
    assert sorted(os.listdir(tmp_path)) == ["data.bin"] and path.is_dir()


def test_racing_writers_each_publish_a_whole_file(tmp_path):
    path = tmp_path / "data.bin"
    first, second = atomic_files.AtomicFile(path), atomic_files.AtomicFile(path)
    assert first.temp_path != second.temp_path
    os.write(first.fd, b"first " * 1000)
    os.write(second.fd, b"second " * 1000)
    second.publish()
    assert path.read_bytes() == b"second " * 1000
    first.publish(durable=True)
    assert path.read_bytes() == b"first " * 1000
    assert sorted(os.listdir(tmp_path)) == ["data.bin"]


def test_a_rename_that_refuses_keeps_the_temporary_for_the_caller(tmp_path):
    path = tmp_path / "data.bin"
    new = atomic_files.AtomicFile(path, mode=0o644)
    os.write(new.fd, b"new")

    def refuse(source, target):
        raise FileExistsError(target)

    with pytest.raises(FileExistsError):
        new.publish(refuse)
    assert new.fd is None and Path(new.temp_path).read_bytes() == b"new"
    new.discard()
    assert os.listdir(tmp_path) == []


def test_a_failed_staged_directory_leaves_the_old_one_and_no_staging(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(Interrupted), atomic_files.staged_directory(target) as staging:
        (open(os.path.join(staging, "new.txt"), "w")).close()
        raise Interrupted
    assert sorted(os.listdir(tmp_path)) == ["out"] and os.listdir(target) == ["old.txt"]
    with atomic_files.staged_directory(tmp_path / "fresh") as staging:
        with open(os.path.join(staging, "new.txt"), "w") as f:
            f.write("new")
    assert (tmp_path / "fresh" / "new.txt").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["fresh", "out"]


def test_a_staged_directory_has_mkdirs_mode_and_leaves_the_umask_alone(tmp_path, monkeypatch):
    """Mode 0777 less the umask, as ``mkdir`` gives, without ever changing the process's
    umask (a moment at 0 would give another thread's new files mode 0666)."""
    previous = os.umask(0o027)
    try:

        def no_umask(mask):
            raise AssertionError(f"os.umask({mask:o}) was called")

        monkeypatch.setattr(os, "umask", no_umask)
        with atomic_files.staged_directory(tmp_path / "out") as staging:
            assert os.stat(staging).st_mode & 0o777 == 0o750
        assert os.stat(tmp_path / "out").st_mode & 0o777 == 0o750
        monkeypatch.undo()
    finally:
        os.umask(previous)


def test_a_temporary_name_already_taken_is_drawn_again(tmp_path, monkeypatch):
    """Both writers create their temporary exclusively and draw a new name when another
    writer holds the one drawn; a file or directory already there is never touched."""
    draws = iter(["aaaaaaaa", "bbbbbbbb", "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"])
    monkeypatch.setattr(atomic_files.secrets, "token_hex", lambda n: next(draws))
    taken_file = tmp_path / "out.bin.aaaaaaaa.tmp"
    taken_file.write_bytes(b"another writer's")
    atomic_files.write_file(tmp_path / "out.bin", b"ours")
    assert (tmp_path / "out.bin").read_bytes() == b"ours"
    assert taken_file.read_bytes() == b"another writer's"

    taken_dir = tmp_path / ".staging-aaaaaaaaaaaaaaaa"
    taken_dir.mkdir()
    (taken_dir / "theirs.txt").write_text("theirs")
    with atomic_files.staged_directory(tmp_path / "dir") as staging:
        assert os.path.basename(staging) == ".staging-bbbbbbbbbbbbbbbb"
    assert os.listdir(tmp_path / "dir") == [] and os.listdir(taken_dir) == ["theirs.txt"]


def use_publish(monkeypatch, publish: str) -> None:
    """Makes atomic_files publish without replacing by ``publish``: "link" (a hard link, the
    first choice), "renameat2" (no hard links) or "reserve" (neither)."""
    import errno

    if publish != "link":

        def no_link(*args):
            raise OSError(errno.EPERM, "no hard links here")

        monkeypatch.setattr(atomic_files.os, "link", no_link)
    if publish == "reserve":
        monkeypatch.setattr(atomic_files, "_rename_noreplace", lambda *args: False)


@pytest.mark.parametrize("publish", ["link", "renameat2", "reserve"])
def test_write_file_without_replacing_refuses_an_existing_path(tmp_path, monkeypatch, publish):
    """Each of the three no-replace publishes keeps a file already there (FileExistsError,
    no temporary left) and publishes where the path is free."""
    use_publish(monkeypatch, publish)
    path = tmp_path / "secret"
    path.write_bytes(b"first")
    with pytest.raises(FileExistsError):
        atomic_files.write_file(path, b"second", replace=False)
    assert path.read_bytes() == b"first" and os.listdir(tmp_path) == ["secret"]
    atomic_files.write_file(tmp_path / "fresh", b"new", replace=False, durable=True)
    assert (tmp_path / "fresh").read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["fresh", "secret"]


def test_temporary_names_are_recognised_and_only_dead_writers_ones_removed(tmp_path):
    path = str(tmp_path / "ckpt.mdl")
    name = atomic_files.temp_name(path)
    assert atomic_files.is_temp_name(name) and not atomic_files.is_temp_name(path)
    assert not atomic_files.is_temp_name(path + ".0123abcg.tmp")  # not hex
    live = atomic_files.AtomicFile(path, lock=True)  # a writer still writing
    dead = atomic_files.AtomicFile(path, lock=True)
    dead.close()  # killed: its lock is gone, its file stays
    young = atomic_files.AtomicFile(path)
    young.close()  # unlocked but new: may be a writer that has not locked it yet
    old = time.time() - 2 * atomic_files.STRAY_MIN_AGE_SECONDS
    for temp in (live.temp_path, dead.temp_path):
        os.utime(temp, (old, old))
    assert sorted(atomic_files.temp_files(path)) == sorted(
        [live.temp_path, dead.temp_path, young.temp_path]
    )
    assert atomic_files.remove_stray_temp_files(path) == [dead.temp_path]
    assert sorted(atomic_files.temp_files(path)) == sorted([live.temp_path, young.temp_path])
    live.publish()
    young.discard()
    assert os.listdir(tmp_path) == ["ckpt.mdl"]
