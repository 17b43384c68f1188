"""The one fact vocabulary (deploy_lib/remote/readings.py): a fact is a read-only step and its parser, read in one
batch."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
from helpers.fake_remote import FakeRemote

from deploy_lib.errors import StepFailed
from deploy_lib.remote import Put, Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK, TOOL_ABSENT_OK, Fact, Readings, read

OWNER = Fact(Step("lock owner", ("cat", "--", "/opt/x/.lock/owner"), ok=ABSENT_OK),
             lambda result: result.stdout.strip() if result.exit_code == 0 else None)
GPUS = Fact(Step("gpus", ("nvidia-smi", "-L"), ok=TOOL_ABSENT_OK),
            lambda result: None if result.exit_code == 127 else result.stdout.count("GPU "))


def test_facts_and_plain_steps_are_read_in_one_batch_and_parsed_by_name() -> None:
    remote = FakeRemote()
    remote.reply(OWNER.step.argv, stdout="alice@laptop\n").reply(GPUS.step.argv, stdout="GPU 0\nGPU 1\n")
    readings = read(remote, [OWNER, GPUS, Step("clock", ("date", "+%s"))])
    assert len(remote.batches) == 1
    assert (readings.value(OWNER), readings.value(GPUS), "clock" in readings) == ("alice@laptop", 2, True)


def test_a_missing_file_or_tool_is_a_fact_not_an_error() -> None:
    remote = FakeRemote()
    remote.reply(OWNER.step.argv, exit_code=1, stderr="cat: no such file").reply(GPUS.step.argv, exit_code=127)
    readings = read(remote, [OWNER, GPUS])
    assert (readings.value(OWNER), readings.value(GPUS), readings.stdout(OWNER.name)) == (None, None, "")


def test_an_exit_code_outside_the_missing_set_fails_the_batch() -> None:
    remote = FakeRemote()
    remote.reply(OWNER.step.argv, exit_code=2, stderr="cat: permission denied")
    with pytest.raises(StepFailed):
        read(remote, [OWNER])


def test_a_fact_not_in_the_batch_names_itself() -> None:
    readings = Readings([])
    assert OWNER.name not in readings
    with pytest.raises(KeyError, match="'lock owner' was not read in this batch"):
        readings.value(OWNER)


def test_a_put_in_the_batch_is_not_a_reading() -> None:
    put = Put(PurePosixPath("/opt/x/f"), b"", 0o644)
    same_name = Step(put.name, ("cat", "--", "/opt/x/f"))
    readings = Readings([StepResult(same_name, 0, "bob\n", "", 0.0), StepResult(put, 0, "", "", 0.0)])
    assert readings.stdout(put.name) == "bob\n"  # the step's result, not the put's written after it
    assert put.name not in Readings([StepResult(put, 0, "", "", 0.0)])
