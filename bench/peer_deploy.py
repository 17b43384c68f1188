"""pyinfra's side of `make bench` (bench/peer.py writes its inventory and files): the job `invoke deploy` does, as a
pyinfra user writes it. Put the unit, env file and launcher our tool renders for the same profile; when one
changed, daemon-reload (only for the unit), restart, and wait until the server answers; a no-op changes nothing.

    pyinfra -y INVENTORY bench/peer_deploy.py     (run by bench/peer.py, never imported)
"""

from pyinfra import host
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

peer = host.data.peer
puts = [files.put(name=f"put {dest}", src=src, dest=dest, mode=mode, _sudo=True)
        for src, dest, mode in peer["files"]]
unit = puts[0]
systemd.daemon_reload(name="daemon-reload", _sudo=True, _if=unit.did_change)
systemd.service(name="restart", service=peer["service"], running=True, restarted=True, enabled=True, _sudo=True,
                _if=any_changed(*puts))
for name, command in peer["waits"]:
    server.shell(name=name, commands=[command], _sudo=True, _if=any_changed(*puts))
