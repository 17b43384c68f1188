"""Writing a file over SFTP: the channel opened within the bound a round trip's has, the file created exclusively
with its mode, written, renamed onto its destination."""

from __future__ import annotations

from pathlib import PurePosixPath

import paramiko
from fabric import Connection

from deploy_lib.remote.ssh import ChannelWatch
from deploy_lib.remote.steps import Put


def open_sftp(connection: Connection, timeout_s: float) -> paramiko.SFTPClient:
    """The connection's SFTP client (Fabric keeps one per connection), each of its requests bounded by `timeout_s`;
    its channel's open and the subsystem's start bounded as a round trip's are (ssh.ChannelWatch): paramiko would
    wait up to an hour for them on a dead link."""
    opening = ChannelWatch(connection.transport).start()
    try:
        sftp: paramiko.SFTPClient = connection.sftp()
        channel = sftp.get_channel()
        if channel is not None:
            channel.settimeout(timeout_s)
        return sftp
    except (paramiko.SSHException, OSError, EOFError) as error:
        if opening.fired:
            raise paramiko.SSHException(f"its SFTP channel did not open within {opening.bound_s:.0f} s: a dead "
                                        "connection") from error
        raise
    finally:
        opening.started()


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
