#!/usr/bin/env bash
# The sandbox GPU VM: a disposable Debian 12 guest with real systemd as PID 1 (systemd-nspawn --boot)
# in its own network namespace, OpenSSH on its own IP, key login as root and as passwordless-sudo user
# "deploy". Only the GPUs and the model are simulated (sandbox/sim, sandbox/nvidia-smi).
#
#   testhost.sh deps-if-missing  # apt-get install the host tools, only if one is missing
#   testhost.sh deps             # apt-get install the host tools unconditionally
#   testhost.sh build            # pristine rootfs in $TH_DIR/rootfs (reuses the cached tarball)
#   testhost.sh start            # overlay on the rootfs (and $TH_LAYERS), netns + veth, boot, wait for ssh
#   testhost.sh stop             # power off (force after $TH_STOP_TIMEOUT s), remove everything
#   testhost.sh reboot           # clean reboot: the guest's systemd reboots, it boots again over the same layer
#   testhost.sh crash            # power loss: every guest process killed at once, the disk as it was at that
#                                # instant (writes still in the page cache lost), booted again (needs TH_DISK)
#   testhost.sh status           # one line per instance: name, state, guest IP
#   testhost.sh info             # KEY=VALUE facts of instance $TH_NAME (for sandbox/manage.py)
#   testhost.sh ssh [cmd...]     # ssh root@guest
#
# Instances: TH_NAME (default th1) selects the instance. Its /30 in 10.213.0.0/16 comes from TH_INDEX,
# which defaults to N-1 for a name "thN" (th1 -> 10.213.0.1/.2, th2 -> 10.213.0.5/.6), so several guests
# can run at once.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_ROOT=${SGLANG_DEPLOY_CACHE:-/var/tmp/sglang-deploy-cache}
TH_DIR=${TH_DIR:-$CACHE_ROOT/testhost}       # work dir: rootfs, overlays, keys, logs (outside the clone)
TH_CACHE=${TH_CACHE:-$TH_DIR}                # rootfs tarballs, keyed by suite+packages+sources
TH_NAME=${TH_NAME:-th1}                      # instance name (hostname, netns and veth "th-$TH_NAME")
TH_SUITE=${TH_SUITE:-bookworm}
TH_PKGS=${TH_PKGS:-systemd,systemd-sysv,dbus,openssh-server,iproute2,python3,python3-venv,ca-certificates,curl,procps,sudo,less,rsync}
TH_STOP_TIMEOUT=${TH_STOP_TIMEOUT:-30}
TH_LAYERS=${TH_LAYERS:-}                     # read-only layers over the rootfs, top first (dir:dir), e.g. a built venv
TH_DISK=${TH_DISK:-}                         # MiB: the writable layer gets an ext4 disk of its own (a loop device)
# command:package. sshd and systemd-analyze serve the tests (a local sshd; offline unit verification).
# losetup and mkfs.ext4 give a guest its own disk (TH_DISK, for `crash`). sudo runs the batch script's root runs
# in tests/test_remote_sudo.py.
HOST_TOOLS=(mmdebstrap:mmdebstrap systemd-nspawn:systemd-container ip:iproute2 ssh:openssh-client
            ssh-keygen:openssh-client zstd:zstd rsync:rsync /usr/sbin/sshd:openssh-server
            systemd-analyze:systemd setpriv:util-linux chromium:chromium losetup:mount mkfs.ext4:e2fsprogs
            stress-ng:stress-ng sudo:sudo)

[[ $TH_NAME =~ ^[a-z][a-z0-9-]{0,11}$ ]] || { echo "TH_NAME must match [a-z][a-z0-9-]{0,11}" >&2; exit 2; }

name_index() {     # thN -> N-1; any other name -> a stable index from its checksum
  if [[ $1 =~ ^th([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge 1 ]; then echo $((BASH_REMATCH[1] - 1))
  else echo $(( $(printf '%s' "$1" | cksum | cut -d' ' -f1) % 8192 + 8192 )); fi
}
TH_INDEX_GIVEN=${TH_INDEX:-}
if [ -z "${TH_INDEX:-}" ] && [ -s "$TH_DIR/run/$TH_NAME/index" ]; then TH_INDEX=$(cat "$TH_DIR/run/$TH_NAME/index"); fi
TH_INDEX=${TH_INDEX:-$(name_index "$TH_NAME")}
[ "$TH_INDEX" -ge 0 ] && [ "$TH_INDEX" -lt 16384 ] || { echo "TH_INDEX must be 0..16383" >&2; exit 2; }
set_addresses() {
  SUBNET_BASE=$((TH_INDEX * 4))
  TH_HOST_IP=10.213.$((SUBNET_BASE / 256)).$((SUBNET_BASE % 256 + 1))    # host end of the veth pair
  TH_GUEST_IP=10.213.$((SUBNET_BASE / 256)).$((SUBNET_BASE % 256 + 2))   # container end
}
set_addresses
TH_PREFIX=30

RUN=$TH_DIR/run/$TH_NAME                     # per-instance state
ROOT=$RUN/root                               # overlay mount = container root
DISK=$RUN/disk.img                           # the writable layer's own disk (TH_DISK), mounted on $RUN/disk
NETNS=th-$TH_NAME
VETH=th-$TH_NAME                             # host-side veth (name <= 15 chars)
KEY=$TH_DIR/ssh/id_ed25519
KNOWN_HOSTS=$TH_DIR/known_hosts/$TH_NAME     # survives stop, so a client's path stays valid
SSH_OPTS=(-i "$KEY" -o UserKnownHostsFile="$KNOWN_HOSTS" -o StrictHostKeyChecking=yes
          -o BatchMode=yes -o ConnectTimeout=2)

log() { printf '[testhost %s] %s\n' "$TH_NAME" "$*" >&2; }

host_sources() {   # the host's active Debian apt source files (given to mmdebstrap as MIRRORs)
  local f found=
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -s "$f" ] || continue
    grep -qE '^[[:space:]]*(URIs:|deb)[[:space:]].*/debian(-security)?/?([[:space:]]|$)' "$f" || continue
    echo "$f"; found=1
  done
  [ -n "$found" ] || { echo "no Debian apt source in /etc/apt" >&2; return 1; }
}

cgroup_dirs() {    # cgroups of this instance; the last one is the cgroup-v2 one
  if [ -d /sys/fs/cgroup/unified ]; then   # hybrid v1/v2
    echo "/sys/fs/cgroup/systemd/testhost.$TH_NAME /sys/fs/cgroup/unified/testhost.$TH_NAME"
  else                                     # pure v2
    echo "/sys/fs/cgroup/testhost.$TH_NAME"
  fi
}
cgroup_v2() { local d; for d in $(cgroup_dirs); do :; done; echo "$d"; }
alive() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${s#Z}" = "$s" ]; }   # not a zombie
cgroup_busy() { [ -d "$(cgroup_v2)" ] && [ -n "$(find "$(cgroup_v2)" -name cgroup.procs -exec cat {} + 2>/dev/null)" ]; }
running() { [ -s "$RUN/nspawn.pid" ] && alive "$(cat "$RUN/nspawn.pid")"; }

cmd_deps() {
  local packages policy=/usr/sbin/policy-rc.d added=
  packages=$(printf '%s\n' "${HOST_TOOLS[@]#*:}" | sort -u)
  # Installing openssh-server must not start a daemon on this machine: the tests run their own sshd.
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod 755 "$policy"; added=1; fi
  apt-get update -q
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $packages || { [ -z "$added" ] || rm -f "$policy"; return 1; }
  [ -z "$added" ] || rm -f "$policy"
}

cmd_deps-if-missing() {
  local entry missing=
  for entry in "${HOST_TOOLS[@]}"; do
    command -v "${entry%%:*}" >/dev/null 2>&1 || missing="$missing ${entry#*:}"
  done
  if [ -z "$missing" ]; then log "host tools present"; return; fi
  log "installing:$missing"
  cmd_deps
}

with_lock() {       # serialise rootfs builds and key creation between concurrent callers (tests, tasks)
  mkdir -p "$TH_DIR"
  ( flock 9; "$@" ) 9>"$TH_DIR/.lock"
}

cmd_build() { with_lock build_rootfs; }

build_rootfs() {
  local key tarball tmp srcs
  srcs=$(host_sources)
  key=$( { printf '%s\n' "$TH_SUITE" "$TH_PKGS" v1; cat $srcs; } | sha256sum | cut -c1-16)
  tarball=$TH_CACHE/rootfs-$TH_SUITE-$key.tar.zst
  if [ -d "$TH_DIR/rootfs/etc" ] && [ "$(cat "$TH_DIR/rootfs.key" 2>/dev/null)" = "$key" ]; then
    log "rootfs up to date"; return
  fi
  if [ -d "$TH_DIR/run" ] && [ -n "$(ls -A "$TH_DIR/run")" ]; then
    log "instances are running on the old rootfs ($(ls "$TH_DIR/run")); stop them first"; exit 1
  fi
  rm -rf "$TH_DIR/rootfs" "$TH_DIR/rootfs.key"; mkdir -p "$TH_DIR/rootfs" "$TH_CACHE"
  if [ -s "$tarball" ]; then
    log "extracting $tarball"
    zstd -dc "$tarball" | tar -C "$TH_DIR/rootfs" --numeric-owner --xattrs --xattrs-include='*' -xpf -
  else
    log "building rootfs with mmdebstrap"
    mmdebstrap --variant=minbase --include="$TH_PKGS" \
      --customize-hook='echo testhost > "$1/etc/hostname"' \
      --customize-hook='echo LANG=C.UTF-8 > "$1/etc/default/locale"' \
      --customize-hook='chroot "$1" useradd -m -s /bin/bash deploy' \
      --customize-hook='echo "deploy ALL=(ALL) NOPASSWD:ALL" > "$1/etc/sudoers.d/deploy"' \
      --customize-hook='chmod 0440 "$1/etc/sudoers.d/deploy"' \
      --customize-hook=': > "$1/etc/machine-id"' \
      "$TH_SUITE" "$TH_DIR/rootfs" $srcs
    tmp=$tarball.tmp.$$
    tar -C "$TH_DIR/rootfs" --numeric-owner --xattrs --xattrs-include='*' -cpf - . | zstd -q -T0 -3 -o "$tmp"
    mv "$tmp" "$tarball"
  fi
  echo "$key" > "$TH_DIR/rootfs.key"
}

install_gpu_standins() {   # simulated driver + sim defaults; copied at each start so edits need no rebuild
  install -m 755 "$HERE/nvidia-smi" "$ROOT/usr/local/bin/nvidia-smi"
  # the toolkit the reference profile's CUDA_HOME names: only its version.json, which the tool reads as a fact
  install -D -m 644 "$HERE/cuda-12.8-version.json" "$ROOT/usr/local/cuda-12.8/version.json"
  install -d -m 755 "$ROOT/etc/sglang-sim"
  install -m 644 "$HERE/guest-sim-config.json" "$ROOT/etc/sglang-sim/config.json"
}

claim_index() {    # names' checksums can collide: a derived index another instance holds moves to the next free one
  local taken i=$TH_INDEX
  taken=$(cat "$TH_DIR"/run/*/index 2>/dev/null || true)
  if [ -z "$TH_INDEX_GIVEN" ]; then
    while grep -qx "$i" <<<"$taken"; do i=$(( (i + 1) % 16384 )); done
  fi
  echo "$i" > "$RUN/index"
}

make_client_key() { [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -C sglang-deploy-sandbox -f "$KEY"; }

# The guests reach each other (a multi-node server's rendezvous) through this host, and nothing else: a route to the
# sandbox's 10.213.0.0/16 only, and forwarding for packets that come in on a sandbox veth only. Idempotent.
guest_routes() {
  ip -n "$NETNS" route replace 10.213.0.0/16 via "$TH_HOST_IP"
  sysctl -qw "net.ipv4.conf.$VETH.forwarding=1"
}

cmd_start() {
  local cg pid i ids
  cmd_build
  if running; then
    TH_INDEX=$(cat "$RUN/index"); set_addresses; guest_routes  # a guest booted before the routes existed
    log "already running"; return
  fi
  cmd_stop                                   # clear leftovers of a crashed run
  mkdir -p "$RUN" "$TH_DIR/ssh" "$TH_DIR/known_hosts"
  with_lock claim_index
  TH_INDEX=$(cat "$RUN/index"); set_addresses
  if ip -o addr show | grep -qE "inet ($TH_HOST_IP|$TH_GUEST_IP)/"; then
    rm -f "$RUN/index"
    log "address $TH_HOST_IP or $TH_GUEST_IP already in use on this host; pick another TH_INDEX"; exit 1
  fi
  with_lock make_client_key
  printf '%s\n' "$TH_LAYERS" > "$RUN/layers"
  if [ -n "$TH_DISK" ]; then
    truncate -s "${TH_DISK}M" "$DISK"
    mkfs.ext4 -q -F -E lazy_itable_init=1,lazy_journal_init=1 "$DISK"
  fi

  # 1. writable layer over the pristine rootfs, kept by reboot and crash, thrown away by stop; per-instance identity
  mount_layer
  install -d -m 700 "$ROOT/root/.ssh"
  install -m 600 "$KEY.pub" "$ROOT/root/.ssh/authorized_keys"
  ids=$(awk -F: '$1=="deploy"{print $3":"$4}' "$ROOT/etc/passwd")
  install -d -m 700 -o "${ids%:*}" -g "${ids#*:}" "$ROOT/home/deploy/.ssh"
  install -m 600 -o "${ids%:*}" -g "${ids#*:}" "$KEY.pub" "$ROOT/home/deploy/.ssh/authorized_keys"
  echo "$TH_NAME" > "$ROOT/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$TH_NAME" > "$ROOT/etc/hosts"
  # a fresh host key per instance start: a stale known_hosts entry must not match a new guest
  rm -f "$ROOT"/etc/ssh/ssh_host_*
  ssh-keygen -q -t ed25519 -N '' -C "root@$TH_NAME" -f "$ROOT/etc/ssh/ssh_host_ed25519_key"
  awk -v ip="$TH_GUEST_IP" '{print ip, $1, $2}' "$ROOT/etc/ssh/ssh_host_ed25519_key.pub" > "$KNOWN_HOSTS"
  install_gpu_standins
  sync -f "$ROOT/etc"   # a new machine's files are on its disk: a power loss right after boot keeps them

  # 2. own network namespace + veth pair; the container gets no default route (they stay over reboot and crash)
  ip netns add "$NETNS"
  ip link add "$VETH" type veth peer name host0 netns "$NETNS"
  ip addr add "$TH_HOST_IP/$TH_PREFIX" dev "$VETH"
  ip link set "$VETH" up
  ip -n "$NETNS" link set lo up
  ip -n "$NETNS" addr add "$TH_GUEST_IP/$TH_PREFIX" dev host0
  ip -n "$NETNS" link set host0 up
  guest_routes
  boot
}

mount_layer() {    # the overlay on the rootfs; its upper and work dirs on the guest's own disk when it has one
  local rw=$RUN i dev
  mkdir -p "$ROOT"
  if [ -f "$DISK" ]; then
    # The image's previous filesystem can outlive its unmount here: another guest's nspawn, started while it was
    # mounted, holds a copy of the mount until it exits. reboot and crash shut that filesystem down first (it writes
    # nothing more), so a second mount of the image is safe; the old loop device detaches when its holder exits.
    for i in $(seq 1 40); do [ -z "$(losetup -j "$DISK")" ] && break; sleep 0.25; done
    [ -z "$(losetup -j "$DISK")" ] || log "the image's previous filesystem (shut down) is still held elsewhere"
    mkdir -p "$RUN/disk"
    # a loop device of its own (mount -o loop may reuse one still attached to the image); detached at umount
    dev=$(losetup -f --show "$DISK")
    mount "$dev" "$RUN/disk"
    losetup -d "$dev"
    rw=$RUN/disk
  fi
  mkdir -p "$rw/upper" "$rw/work"
  mount -t overlay overlay -o "lowerdir=${TH_LAYERS:+$TH_LAYERS:}$TH_DIR/rootfs,upperdir=$rw/upper,workdir=$rw/work" "$ROOT"
}

unmount_layer() {   # a killed guest's mount namespace goes away a moment after its last process: umount retries
  local m i
  for m in "$ROOT" "$RUN/disk"; do
    mountpoint -q "$m" 2>/dev/null || continue
    for i in $(seq 1 40); do umount "$m" 2>/dev/null && break; sleep 0.25; done
    if mountpoint -q "$m" 2>/dev/null; then umount -l "$m"; fi
  done
}

boot() {
  local cg pid i state
  # 3. own cgroup, so nspawn's supervisor/payload sub-cgroups land under it
  for cg in $(cgroup_dirs); do mkdir -p "$cg"; done

  # 4. boot. No systemd/machined on the host: --register=no and --keep-unit are required
  setsid bash -c 'for cg in '"$(cgroup_dirs)"'; do echo $$ > "$cg/cgroup.procs"; done
    exec systemd-nspawn -q -D "$0" -M "$1" --boot --register=no --keep-unit \
      --network-namespace-path="/run/netns/$2" --link-journal=no \
      --resolv-conf=off --timezone=off --console=read-only' \
    "$ROOT" "$TH_NAME" "$NETNS" < /dev/null > "$RUN/nspawn.log" 2>&1 &
  pid=$!; echo "$pid" > "$RUN/nspawn.pid"

  # 5. ready = sshd accepts the key and boot has finished
  for i in $(seq 1 120); do
    alive "$pid" || { log "nspawn exited:"; cat "$RUN/nspawn.log" >&2; exit 1; }
    # booted: running, or degraded (a unit failed at boot, which a test after a crash wants to see)
    state=$(ssh "${SSH_OPTS[@]}" "root@$TH_GUEST_IP" systemctl is-system-running --wait 2>/dev/null || true)
    if [ "$state" = running ] || [ "$state" = degraded ]; then
      log "up: ssh deploy@$TH_GUEST_IP  key=$KEY  known_hosts=$KNOWN_HOSTS"
      return
    fi
    sleep 0.5
  done
  log "timed out waiting for ssh; see $RUN/nspawn.log"; exit 1
}

kill_all() {         # every process of the guest (nspawn's supervisor included) at once, as a power cut would
  local i
  cgroup_busy || return 0
  echo 1 > "$(cgroup_v2)/cgroup.kill"
  # a process inside a system call on the shut-down disk dies when the call returns: up to minutes under load
  for i in $(seq 1 480); do cgroup_busy || return 0; sleep 0.25; done
  log "still running after the kill: $(find "$(cgroup_v2)" -name cgroup.procs -exec cat {} + 2>/dev/null |
    xargs -r ps -o pid=,stat=,wchan:20=,comm= -p | tr '\n' ';')"
}

remove_sub_cgroups() {  # nspawn makes its supervisor/payload cgroups again at the next boot
  local cg
  for cg in $(cgroup_dirs); do
    if [ -d "$cg" ]; then find "$cg" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
}

shutdown_disk() {    # EXT4_IOC_SHUTDOWN on the guest's disk: 1 flushes the journal first, 2 does not (a power cut)
  [ -f "$DISK" ] || return 0
  python3 -c 'import fcntl, os, struct, sys; fcntl.ioctl(os.open(sys.argv[1], os.O_RDONLY), 0x8004587d, struct.pack("I", int(sys.argv[2])))' "$RUN/disk" "$1"
}

cmd_reboot() {       # the guest's own `systemctl reboot`: its services stop cleanly, then nspawn exits (133)
  local pid i
  running || { log "not running"; exit 1; }
  TH_LAYERS=$(cat "$RUN/layers")
  pid=$(cat "$RUN/nspawn.pid")
  ssh "${SSH_OPTS[@]}" "root@$TH_GUEST_IP" 'systemctl reboot' >/dev/null 2>&1 || true
  for i in $(seq 1 $((TH_STOP_TIMEOUT * 2))); do alive "$pid" || break; sleep 0.5; done
  alive "$pid" && log "reboot hung for $TH_STOP_TIMEOUT s: forcing kill"
  kill_all
  if [ -f "$DISK" ]; then sync -f "$RUN/disk"; shutdown_disk 1; fi   # all written, then nothing more
  unmount_layer
  remove_sub_cgroups
  log "rebooting"
  mount_layer
  boot
}

cmd_crash() {        # power loss: no shutdown; the disk keeps only what reached it before the kill
  [ -f "$DISK" ] || { log "no disk of its own: a killed guest's unsynced writes would survive in this machine's" \
                          "page cache; start it with TH_DISK=MiB (sandbox.up --disk)"; exit 1; }
  running || { log "not running"; exit 1; }
  TH_LAYERS=$(cat "$RUN/layers")
  # The power cut: the guest's filesystem stops writing at once, its journal not flushed and its dirty pages dropped
  # (ext4's shutdown ioctl, EXT4_IOC_SHUTDOWN with EXT4_GOING_FLAGS_NOLOGFLUSH, as xfstests' crash tests use it):
  # the disk keeps what the guest had synced and what the kernel had written back, nothing after this instant.
  shutdown_disk 2
  kill_all
  unmount_layer
  log "power lost; booting"
  mount_layer
  boot
}

cmd_stop() {
  local pid cg i
  pid=$(cat "$RUN/nspawn.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && alive "$pid"; then
    kill -TERM "$pid"      # nspawn sends SIGRTMIN+3 to the container's systemd: clean poweroff
    for i in $(seq 1 $((TH_STOP_TIMEOUT * 2))); do alive "$pid" || break; sleep 0.5; done
  fi
  if cgroup_busy; then     # hung shutdown or orphaned container: kill the whole cgroup tree
    log "forcing kill"
    kill_all
  fi
  unmount_layer
  ip netns del "$NETNS" 2>/dev/null || true      # also removes the veth pair
  ip link del "$VETH" 2>/dev/null || true
  for cg in $(cgroup_dirs); do
    if [ -d "$cg" ]; then find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
  if [ -f "$RUN/nspawn.log" ]; then mkdir -p "$TH_DIR/logs"; cp "$RUN/nspawn.log" "$TH_DIR/logs/$TH_NAME-nspawn.log"; fi
  rm -rf "$RUN"
}

cmd_info() {
  local state=stopped
  running && state=running
  printf '%s=%s\n' name "$TH_NAME" state "$state" host_ip "$TH_HOST_IP" guest_ip "$TH_GUEST_IP" \
    key "$KEY" known_hosts "$KNOWN_HOSTS" netns "$NETNS" veth "$VETH"
}

cmd_status() {
  local names n
  names=$( { ls "$TH_DIR/run" 2>/dev/null; echo "$TH_NAME"; } | sort -u)
  for n in $names; do
    (TH_NAME=$n TH_INDEX='' bash "${BASH_SOURCE[0]}" info) |
      awk -F= '{v[$1]=$2} END {printf "%-12s %-8s %s\n", v["name"], v["state"], v["guest_ip"]}'
  done
}

cmd_ssh() { exec ssh "${SSH_OPTS[@]}" "root@$TH_GUEST_IP" "$@"; }

case ${1:-} in
  deps|deps-if-missing|build|start|stop|reboot|crash|status|info|ssh) "cmd_$1" "${@:2}" ;;
  *) echo "usage: $0 deps|deps-if-missing|build|start|stop|reboot|crash|status|info|ssh" >&2; exit 2 ;;
esac
