"""The shard's socket safety rules, in process (the process-level behaviour is in
tests/integration/test_shard_lifecycle.py)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from tgictl.errors import ConfigError
from tgictl.runtime.shard.uds import (
    check_socket_path,
    prepare_socket_dir,
    remove_socket,
)


def test_a_missing_directory_is_created_private(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b"
    prepare_socket_dir(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert directory.stat().st_uid == os.getuid()


@pytest.mark.parametrize("mode", [0o700, 0o755, 0o750])
def test_a_directory_only_the_user_can_write_is_accepted(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    directory.chmod(mode)
    prepare_socket_dir(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == mode  # left as it was


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o702])
def test_a_directory_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    directory.chmod(mode)
    with pytest.raises(ConfigError, match=f"socket directory {directory} is writable by group or others"):
        prepare_socket_dir(directory)


def test_a_symlink_or_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ConfigError, match="is not a directory"):
        prepare_socket_dir(tmp_path / "link")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        prepare_socket_dir(tmp_path / "file")


def test_a_free_path_and_a_stale_socket_are_allowed(tmp_path: Path) -> None:
    check_socket_path(tmp_path / "free-0")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "stale-0"))
    stale.close()  # the file stays, nobody listens
    check_socket_path(tmp_path / "stale-0")


def test_a_live_socket_or_another_file_is_refused(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(tmp_path / "live-0"))
        live.listen()
        with pytest.raises(ConfigError, match="another server is already listening"):
            check_socket_path(tmp_path / "live-0")
    (tmp_path / "plain-0").write_text("not a socket")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        check_socket_path(tmp_path / "plain-0")


def test_remove_socket_leaves_a_replacement_alone(tmp_path: Path) -> None:
    ours = tmp_path / "s-0"
    ours.write_text("")
    inode = ours.lstat().st_ino
    replacement = tmp_path / "other"
    replacement.write_text("")
    os.replace(replacement, ours)  # someone else's file now has the name
    remove_socket(ours, inode)
    assert ours.exists()
    remove_socket(ours, ours.lstat().st_ino)
    assert not ours.exists()
    remove_socket(ours, 0)  # already gone: nothing to do
