"""A root step that names the sudo it runs under: the PID of the nearest `sudo` process above it (above its own
`timeout` and the batch script's bash), or "none". Steps of one root run print the same PID."""

from __future__ import annotations

from deploy_lib.remote import Step

SUDO_ABOVE = """p=$PPID
while [ "$p" -gt 1 ]; do
  read -r name </proc/$p/comm
  if [ "$name" = sudo ]; then echo "$p"; exit 0; fi
  while read -r key value _; do if [ "$key" = PPid: ]; then p=$value; fi; done </proc/$p/status
done
echo none"""


def sudo_above(name: str) -> Step:
    return Step(name, ("sh", "-c", SUDO_ABOVE), sudo=True)
