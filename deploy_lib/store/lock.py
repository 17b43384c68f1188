"""The host lock (Kamal's: mkdir is the atomic test-and-set, owner.json says who, boot_id in which boot of the host it
was taken): who holds it, whether it looks abandoned, when the next command takes it over (its owner is gone: the
host rebooted, or the owner's process on this machine ended), and the steps that take, check and release it: all
pure. deploy_lib/host/store.py sends them (`take_lock`, the re-entrant `host_lock` every change to a store runs
under, and `lock_on_first_change`, the lock of a command that may change nothing)."""

from __future__ import annotations

import getpass
import json
import os
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePosixPath

from deploy_lib.errors import LockHeld
from deploy_lib.remote import Put, Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK, Readings
from deploy_lib.store.history import TAKEN_OVER, Tags, append_history, history_entry, operator_name
from deploy_lib.store.layout import FILE_MODE, StoreLayout, iso_time, json_line

# A lock older than this is reported as stale even when its owner cannot be checked (another machine).
STALE_LOCK_AFTER_S = 3 * 3600
# A lock directory without owner.json (acquire interrupted between mkdir and the write) is stale after this.
OWNERLESS_LOCK_GRACE_S = 60

FACT_CLOCK = "store facts: clock"
FACT_LOCK = "store facts: lock"
FACT_LOCK_OWNER = "store facts: lock owner"
FACT_LOCK_BOOT = "store facts: lock boot id"
FACT_BOOT_ID = "store facts: lock: the host's boot id"
FACT_UP = "store facts: lock: seconds since the host booted"  # pid 1's age: a VM's kernel or a container's init
# pid 1's age to the clock tick: the kernel's uptime less pid 1's start (/proc/1/stat field 22, in ticks since the
# kernel booted), so a container's init counts as its host's boot
_PID1_AGE = 'set -- $(cat /proc/uptime) $(cut -d" " -f22 /proc/1/stat) $(getconf CLK_TCK); echo "$1 $3 $4"'
BOOT_ID = "/proc/sys/kernel/random/boot_id"  # a new random id at each boot of the kernel (a container's: of it)
FACT_STORE_DIGEST = "store facts: digest"

# What a command decides from and another command changes: where current points, each release directory and file
# (name, size, mtime) and history's size and mtime; their sha256, printed by the read and compared by the take.
_STORE_DIGEST = ('{ readlink -- "$1"; find "$2" -mindepth 1 -maxdepth 2 -printf \'%P %s %T@\\n\'; '
                 'stat -c \'%s %Y\' -- "$3"; } 2>/dev/null | sha256sum')


def _digest_argv(layout: StoreLayout, script: str, *more: str) -> tuple[str, ...]:
    return ("sh", "-c", script, "sh", str(layout.current), str(layout.releases), str(layout.history), *more)


def store_digest_step(layout: StoreLayout) -> Step:
    """Read-only: the digest of the store's state that `lock_on_first_change` compares when it takes the lock."""
    return Step(FACT_STORE_DIGEST, _digest_argv(layout, _STORE_DIGEST), ok=ABSENT_OK)


def parse_store_digest(result: StepResult | None) -> str | None:
    return result.stdout.strip() if result is not None and result.exit_code == 0 and result.stdout.strip() else None


def lock_fact_steps(layout: StoreLayout) -> list[Step]:
    return [
        Step(FACT_CLOCK, ("date", "+%s.%N")),
        Step(FACT_LOCK, ("stat", "-c", "%.9Y", "--", str(layout.lock)), ok=ABSENT_OK),
        Step(FACT_LOCK_OWNER, ("cat", "--", str(layout.lock_owner)), ok=ABSENT_OK),
        Step(FACT_LOCK_BOOT, ("cat", "--", str(lock_boot_file(layout))), ok=ABSENT_OK),
        Step(FACT_BOOT_ID, ("cat", "--", BOOT_ID), ok=ABSENT_OK),
        Step(FACT_UP, ("sh", "-c", _PID1_AGE), ok=ABSENT_OK),
    ]


def lock_boot_file(layout: StoreLayout) -> PurePosixPath:
    """The host's boot id when the lock was taken, copied by the host itself in the take's round trip."""
    return layout.lock / "boot_id"


@dataclass(frozen=True)
class LockOwner:
    """Who holds the lock and for what; `token` tells this holder's lock from one taken after a forced unlock."""

    user: str
    host: str
    pid: int
    time: str
    purpose: str   # what the holder is doing: "deploy glm5-nvfp4", "venv build", ...
    token: str

    def to_json(self) -> bytes:
        return json_line({"user": self.user, "host": self.host, "pid": self.pid, "time": self.time,
                           "purpose": self.purpose, "token": self.token})

    @classmethod
    def from_json(cls, text: str) -> LockOwner:
        data = json.loads(text)
        # owner.json written before `purpose` existed names the release being deployed
        purpose = data["purpose"] if "purpose" in data else f"deploy of release {data['release']}"
        return cls(user=str(data["user"]), host=str(data["host"]), pid=int(data["pid"]), time=str(data["time"]),
                   purpose=str(purpose), token=str(data["token"]))

    def __str__(self) -> str:
        return f"{self.user}@{self.host} (pid {self.pid}) since {self.time} ({self.purpose})"


def this_process_owner(purpose: str, now: datetime) -> LockOwner:
    return LockOwner(user=getpass.getuser(), host=socket.gethostname(), pid=os.getpid(), time=iso_time(now),
                     purpose=purpose, token=secrets.token_hex(8))


@dataclass(frozen=True)
class LockInfo:
    owner: LockOwner | None  # None: owner.json missing or unreadable
    age_s: float             # from the lock directory's mtime, by the host's own clock
    taken_in_boot: str | None = None  # the host's boot id when it was taken (None: a lock of an older version, or
    host_boot: str | None = None      # a power cut before it was written); the host's boot id now
    host_up_s: float | None = None    # seconds since the host booted
    taken_at: str | None = field(default=None, compare=False)  # its mtime as `stat` printed it: the takeover guard


def _boot_id(result: StepResult | None) -> str | None:
    return result.stdout.strip() or None if result is not None and result.exit_code == 0 else None


def parse_lock(clock_out: str, stat: StepResult, owner: StepResult, taken_in_boot: StepResult | None = None,
               host_boot: StepResult | None = None, host_up: StepResult | None = None) -> LockInfo | None:
    if stat.exit_code != 0:
        return None
    try:
        lock_owner: LockOwner | None = LockOwner.from_json(owner.stdout) if owner.exit_code == 0 else None
    except (ValueError, KeyError, TypeError):
        lock_owner = None
    return LockInfo(lock_owner, max(float(clock_out.strip()) - float(stat.stdout.strip()), 0.0),
                    _boot_id(taken_in_boot), _boot_id(host_boot), _pid1_age(host_up), stat.stdout.strip())


def _pid1_age(result: StepResult | None) -> float | None:
    """Seconds since pid 1 started, from `_PID1_AGE`'s "UPTIME START_TICKS TICKS_PER_S"."""
    try:
        uptime, start, ticks = (float(word) for word in (_boot_id(result) or "").split())
        return uptime - start / ticks
    except (ValueError, ZeroDivisionError):
        return None


def parse_lock_facts(results: Sequence[StepResult] | Readings) -> LockInfo | None:
    found = Readings.of(results)
    return parse_lock(found[FACT_CLOCK].stdout, found[FACT_LOCK], found[FACT_LOCK_OWNER], found.get(FACT_LOCK_BOOT),
                      found.get(FACT_BOOT_ID), found.get(FACT_UP))


LOCK_TAKE = "lock: take"
LOCK_STILL_OURS = "lock: still ours"
LOCK_STORE_UNCHANGED = "lock: store unchanged since it was read"


def store_unchanged_step(layout: StoreLayout, digest: str) -> Step:
    """Exit 0 when the store's digest is still `digest` (what the command decided from), 1 when it changed."""
    return Step(LOCK_STORE_UNCHANGED, _digest_argv(layout, f'test "$({_STORE_DIGEST})" = "$4"', digest))


def acquire_lock(layout: StoreLayout, owner: LockOwner) -> list[Step | Put]:
    return [
        Step("lock: store directory", ("mkdir", "-p", "--", str(layout.base)), sudo=True),
        Step(LOCK_TAKE, ("mkdir", "--", str(layout.lock)), sudo=True),
        Put(layout.lock_owner, owner.to_json(), FILE_MODE, sudo=True),
        Step("lock: boot id", ("cp", "--", BOOT_ID, str(lock_boot_file(layout))), sudo=True),
    ]


def release_lock(layout: StoreLayout, owner: LockOwner) -> list[Step | Put]:
    """Remove the lock only if it is still ours (someone may have forced it open and taken it since)."""
    token = f'"token":"{owner.token}"'
    return [
        Step(LOCK_STILL_OURS, ("grep", "-q", "-F", "-e", token, "--", str(layout.lock_owner))),
        Step("lock: release", ("rm", "-rf", "--", str(layout.lock)), sudo=True),
    ]


def remove_lock(layout: StoreLayout) -> list[Step | Put]:
    return [Step("lock: remove", ("rm", "-rf", "--", str(layout.lock)), sudo=True)]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def owner_gone(lock: LockInfo, this_host: str, is_alive: Callable[[int], bool]) -> str | None:
    """Why the lock's owner is certainly gone, so the next command takes the lock over: the host rebooted since
    it was taken (no command survives its host's reboot: the owner's round trips ended with it), or the owner's
    process on this very machine no longer exists. None: it may still be working (`unlock --force` for the rest)."""
    if lock.taken_in_boot and lock.host_boot and lock.taken_in_boot != lock.host_boot:
        return f"the host has rebooted since it was taken (boot {lock.taken_in_boot[:8]}, now {lock.host_boot[:8]})"
    # no boot id: a power cut between the mkdir and its files, or an older version's lock; its age tells
    if lock.taken_in_boot is None and lock.host_up_s is not None and lock.age_s > lock.host_up_s:
        return f"the host has rebooted since it was taken (the lock is {lock.age_s:.0f} s old, the host up " \
               f"{lock.host_up_s:.0f} s)"
    owner = lock.owner
    if owner is not None and owner.host == this_host and not is_alive(owner.pid):
        return f"its owner, pid {owner.pid} on this machine ({this_host}), is no longer running"
    return None


def lock_staleness(lock: LockInfo, this_host: str, is_alive: Callable[[int], bool],
                   stale_after_s: float = STALE_LOCK_AFTER_S) -> str | None:
    """Why the lock looks abandoned, or None while its owner may still be working."""
    gone = owner_gone(lock, this_host, is_alive)
    if gone is not None:
        return gone
    if lock.owner is None and lock.age_s > OWNERLESS_LOCK_GRACE_S:
        return f"it has no readable owner.json and is {lock.age_s:.0f} s old"
    if lock.age_s > stale_after_s:
        return f"it is {lock.age_s / 3600:.1f} h old (stale after {stale_after_s / 3600:.1f} h)"
    return None


def lock_held_error(where: str, lock: LockInfo, staleness: str | None) -> LockHeld:
    holder = str(lock.owner) if lock.owner else "an unknown owner (no readable owner.json)"
    message = f"the deploy lock on {where} is held by {holder}; lock age {lock.age_s:.0f} s"
    if staleness:
        return LockHeld(f"{message}; it looks stale: {staleness}",
                        hint="`invoke unlock` removes it")
    return LockHeld(message, hint="wait for that run to finish; if you are sure it is gone, "
                                  "`invoke unlock --force` removes the lock")


@dataclass(frozen=True)
class LockContext:
    """What lock decisions need to know about this machine; injectable for tests."""

    where: str                                   # the target host, for messages
    this_host: str = field(default_factory=socket.gethostname)
    is_alive: Callable[[int], bool] = pid_alive
    stale_after_s: float = STALE_LOCK_AFTER_S
    note: Callable[[str], None] | None = None    # where the one line of a takeover goes (the command's progress)

    def held_by(self, lock: LockInfo) -> LockHeld:
        return lock_held_error(self.where, lock, lock_staleness(lock, self.this_host, self.is_alive,
                                                                self.stale_after_s))

    def takeover(self, lock: LockInfo) -> Takeover | None:
        """The takeover of a lock whose owner is gone; None: the lock stands."""
        reason = owner_gone(lock, self.this_host, self.is_alive)
        if reason is None:
            return None
        holder = str(lock.owner) if lock.owner else "an unknown owner"
        return Takeover(lock, f"took over the deploy lock on {self.where} from {holder}: {reason}")

    def announce(self, takeover: Takeover | None) -> None:
        """Say the takeover's line, once it happened."""
        if takeover is not None and self.note is not None:
            self.note(takeover.line)


@dataclass(frozen=True)
class Takeover:
    lock: LockInfo
    line: str

    def steps(self, layout: StoreLayout, where: str) -> list[Step | Put]:
        """Remove the dead owner's lock, only if it is still that one (another command may have taken it over
        first: then the take fails as on any held lock); the history line is appended by `recorded`."""
        owner, boot = self.lock.owner, self.lock.taken_in_boot
        if owner is not None:
            token = f'"token":"{owner.token}"'
            check: tuple[str, ...] = ("grep", "-q", "-F", "-e", token, "--", str(layout.lock_owner))
        elif boot is not None:
            check = ("grep", "-q", "-x", "-F", "-e", boot, "--", str(lock_boot_file(layout)))
        else:  # neither: the very directory that was read (its mtime)
            check = ("sh", "-c", 'test "$(stat -c %.9Y -- "$1")" = "$2"', "sh", str(layout.lock),
                     self.lock.taken_at or "")
        return [Step(LOCK_STILL_THEIRS, check, sudo=True), Step("lock: take over", ("rm", "-rf", "--",
                                                                                   str(layout.lock)), sudo=True)]

    def recorded(self, layout: StoreLayout, where: str) -> list[Step | Put]:
        tags = Tags(who=operator_name(), host=where, release="", profile="", profile_hash="")
        return append_history(layout, history_entry("lock", TAKEN_OVER, tags, datetime.now(UTC), self.line))


LOCK_STILL_THEIRS = "lock: still the dead owner's"


def no_longer_ours(where: str) -> LockHeld:
    return LockHeld(f"the deploy lock on {where} was no longer ours at the end of this run (forced open and taken "
                    "by someone else?); it was left in place", hint="`invoke unlock` shows who holds it now")


def first_change_take(layout: StoreLayout, owner: LockOwner, digest: str, takeover: Takeover | None, where: str
                      ) -> list[Step | Put]:
    """The take of a lock with a command's first change: a dead owner's lock removed, mkdir and owner.json, then the
    store's digest compared with the one the command decided from; the takeover's history line after the comparison
    (it is part of this command's change)."""
    removal, record = (takeover.steps(layout, where), takeover.recorded(layout, where)) if takeover else ([], [])
    return [*removal, *acquire_lock(layout, owner), store_unchanged_step(layout, digest), *record]
