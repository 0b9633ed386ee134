"""The shard's Unix socket files: a private directory, stale files, removal (no torch here, so the
launcher can apply the same rules before it starts any shard).

Whoever can write the socket directory can replace a shard's socket with their own and receive
every prompt, so the directory must belong to this user and give no write permission to group or
others. The socket file's existence is the launcher's readiness signal, so a stale one may be
replaced, but a socket someone still listens on is another server's and is refused.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from pathlib import Path

from tgictl.errors import ConfigError

log = logging.getLogger("tgictl.shard")


def prepare_socket_dir(directory: Path) -> None:
    """Create `directory` (mode 0700) if missing; refuse one that another user could write to."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:  # a file (or a dangling symlink) has the name
        raise ConfigError(f"socket directory {directory} is not a directory") from None
    except OSError as err:
        raise ConfigError(f"cannot create the socket directory {directory}: {err.strerror}") from None
    st = directory.lstat()  # a symlink is refused: its target is what would need checking
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"socket directory {directory} is not a directory")
    if st.st_uid != os.getuid():
        raise ConfigError(
            f"socket directory {directory} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()}); "
            "choose a --uds-path inside a directory you own"
        )
    if st.st_mode & 0o022:
        raise ConfigError(
            f"socket directory {directory} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"run `chmod go-w {directory}` or choose another --uds-path"
        )


def check_socket_path(path: Path) -> None:
    """Allow a free path or a stale socket (replaced later); refuse a live server or a non-socket file."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"{path} exists and is not a socket; remove it or choose another --uds-path")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)  # a live server with a full backlog must not hang the start
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):  # nobody listens, or gone meanwhile: stale
            log.info("replacing the stale socket %s", path)
            return
        except OSError as err:
            raise ConfigError(
                f"cannot tell whether {path} is in use ({err}); remove it or choose another --uds-path"
            ) from None
    raise ConfigError(f"another server is already listening on {path}; stop it or choose another --uds-path")


def remove_socket(path: Path, inode: int) -> None:
    """Remove our socket file, unless someone already replaced it with theirs."""
    try:
        if path.lstat().st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass
