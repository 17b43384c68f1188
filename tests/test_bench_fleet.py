"""bench/fleet.py's figure, without a guest: the tool's own time of a group is its slowest host's, each host's end
less its own server start (issue 30 point 3), and the table says it."""

from __future__ import annotations

from bench.fleet import GroupRun, HostPhases, report


def host(restarted: float, ready: float, ended: float) -> HostPhases:
    return HostPhases(began=0.0, restarted=restarted, ready=ready, noticed=ready + 0.1, grace_ended=ended - 0.05,
                      ended=ended, cpu_to_restart=0.05)


def test_a_groups_own_time_is_its_slowest_hosts_not_the_wall_less_the_slowest_start() -> None:
    """Host a's server started slowest (8 s) but ended first; host b's started in 5 s, 3 s late, and ended last. Its
    own time, 10 - 5 = 5 s, is the group's; the wall time less the slowest start, 10 - 8 = 2 s, was judged before and
    is the own time of neither host (a's is 9.5 - 8 = 1.5 s)."""
    group = GroupRun(hosts=2, seconds=10.0, cpu_s=0.2, round_trips=20, guests_cpu_s=5.0,
                     phases=(host(0.5, 8.5, 9.5), host(3.0, 8.0, 10.0)))
    assert group.slowest_start_s == 8.0 and group.own_s == 5.0


def test_the_table_judges_8_hosts_by_their_slowest_hosts_own_time_against_one_hosts() -> None:
    one = GroupRun(1, 8.0, 0.12, 10, 2.5, (host(0.5, 6.0, 8.0),))
    eight = GroupRun(8, 14.0, 1.0, 88, 20.0, tuple(host(0.5 + n * 0.3, 9.0 + n * 0.1, 12.0 + n * 0.25)
                                                   for n in range(8)))
    quiet = {1: [GroupRun(1, 0.25, 0.03, 2, 0.25)], 8: [GroupRun(8, 1.0, 0.24, 16, 2.0)]}
    lines = report({1: [one], 8: [eight]}, quiet)
    # one host: 8.0 - 5.5 = 2.5 s; of eight, the last: 13.75 - (9.7 - 2.6) = 6.65 s
    assert "own time, 8 hosts / one: 2.66x (MISS, target <= 1.5x for 8 hosts)" in lines[-1]
    assert "no-op client CPU per host at 8: 0.030 s (PASS" in lines[-1]
