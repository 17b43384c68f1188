"""Writing a file over SFTP: created exclusively with its mode, written, renamed onto its destination."""

from __future__ import annotations

from pathlib import PurePosixPath

import paramiko

from deploy_lib.remote.steps import Put


def put_directly(sftp: paramiko.SFTPClient, put: Put, token: str) -> tuple[int, str]:
    temp = put.temp_path(token)
    try:
        upload(sftp, temp, put.data, put.mode)
        sftp.posix_rename(str(temp), str(put.dest))
    except OSError:
        remove_quietly(sftp, temp)
        raise
    return 0, ""


def upload(sftp: paramiko.SFTPClient, path: PurePosixPath, data: bytes, mode: int) -> None:
    """Create `path` exclusively, set its mode while still empty, then write: no moment with wider access."""
    with sftp.open(str(path), "wbx") as remote_file:
        remote_file.chmod(mode)
        remote_file.set_pipelined(True)
        remote_file.write(data)


def remove_quietly(sftp: paramiko.SFTPClient, path: PurePosixPath, directory: bool = False) -> None:
    try:
        (sftp.rmdir if directory else sftp.remove)(str(path))
    except OSError:
        pass  # already gone, or never created
