"""Host facts as data: a Fact is one read-only step plus the pure parser of its result; Readings holds one batch's
results by step name. Every module that reads the host names its facts with these, so a new fact is a Step and a
parser (tested on captured output), batched with the others and parsed from the batch's Readings."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from deploy_lib.remote import Remote, Step, StepResult

# Exit codes of a read that mean "found nothing", which is a fact, not an error:
# cat, stat, readlink, find, tail, grep, sha256sum, df and `systemctl cat` exit 1 when the path or unit is absent.
ABSENT_OK = frozenset({0, 1})
# ... and also 2 (an operand the tool cannot read) or 127 (the tool itself is not installed, e.g. no nvidia-smi).
TOOL_ABSENT_OK = ABSENT_OK | {2, 127}
# Every exit code: a read whose outcome, whatever it is, is for its parser to judge.
ANY_EXIT = frozenset(range(256))

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)  # a Fact[dict] is a Fact[Mapping]: its value only comes out


@dataclass(frozen=True)
class Fact(Generic[T_co]):
    """One read-only step and the pure parser of its result (its `ok` codes say which misses are facts)."""

    step: Step
    parse: Callable[[StepResult], T_co]

    @property
    def name(self) -> str:
        return self.step.name


class Readings:
    """The results of one batch by step name (puts and other steps may be in the batch too)."""

    def __init__(self, results: Iterable[StepResult]) -> None:
        self.results = tuple(results)  # in batch order
        self._by_name = {result.step.name: result for result in self.results if isinstance(result.step, Step)}

    @classmethod
    def of(cls, results: Iterable[StepResult] | Readings) -> Readings:
        return results if isinstance(results, Readings) else cls(results)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> StepResult:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{name!r} was not read in this batch") from None

    def get(self, name: str) -> StepResult | None:
        return self._by_name.get(name)

    def stdout(self, name: str) -> str:
        """What a read printed, or "" when it found nothing (exited non-zero with an `ok` code)."""
        result = self[name]
        return result.stdout if result.exit_code == 0 else ""

    def value(self, fact: Fact[T]) -> T:
        return fact.parse(self[fact.name])


def read(remote: Remote, steps: Iterable[Fact[Any] | Step]) -> Readings:
    """Run read-only steps (facts, or plain steps parsed by hand) as one batch; a read is safe to send again after a
    dropped connection (`remote.steps.repeatable`); nothing to read sends nothing."""
    batch = [replace(item.step if isinstance(item, Fact) else item, repeatable=True) for item in steps]
    return Readings(remote.run(batch) if batch else ())
