"""Parse a launch command with the installed SGLang's own argparse definitions.

This is deliberately independent of any reading of the source text: it executes the installed
`sglang.srt.server_args` module and calls `ServerArgs.add_cli_args(parser)`, as `prepare_server_args()`
does, with stand-in modules for everything that is not installed (torch, triton, transformers, ...).
Run as `python -m sglang_sim.argcheck` with the arguments as a JSON list on stdin (not argv: they may hold
the API key): exit 2 with argparse's own message on a bad command, else print the parsed namespace as one
JSON line after RESULT_MARKER.
"""

from __future__ import annotations

import abc
import argparse
import importlib.abc
import importlib.machinery
import json
import re
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

RESULT_MARKER = "SGLANG_SIM_ARGS "
# Must be real: a stand-in for them would change how the argument tables are built.
NEVER_STUBBED = frozenset({"sglang", "flashinfer", "msgspec"})
# Attributes a stand-in module must not have: `hasattr(torch, "npu")` selects the Ascend code path.
ABSENT_ATTRIBUTES = frozenset({"npu"})


class _Anything(str):
    """Value of any attribute of a missing module: callable, iterable, falsy, a base class, "big"."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Anything:
        return str.__new__(cls, "stub")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Anything:
        return _Anything()

    def __getattr__(self, name: str) -> _Anything:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (_AnythingBase,)

    def __getitem__(self, key: Any) -> _Anything:
        return _Anything()

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __delitem__(self, key: Any) -> None:
        pass

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __contains__(self, item: object) -> bool:
        return False

    def __int__(self) -> int:
        return 0

    __index__ = __int__

    def __float__(self) -> float:
        return 0.0

    # version checks such as `torch_release >= (2, 4)` should take the "new enough" branch
    def __lt__(self, other: object) -> bool:
        return False

    __le__ = __lt__

    def __gt__(self, other: object) -> bool:
        return True

    __ge__ = __gt__

    def __add__(self, other: object) -> _Anything:
        return self

    __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __floordiv__ = __add__
    __and__ = __rand__ = __or__ = __ror__ = __add__

    def __enter__(self) -> _Anything:
        return self

    def __exit__(self, *exc: object) -> None:  # None: an exception inside the block goes on
        return None

    def __hash__(self) -> int:
        return id(self)


class _AnythingMeta(abc.ABCMeta):
    def __getattr__(cls, name: str) -> _Anything:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything()


class _AnythingBase(metaclass=_AnythingMeta):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> _Anything:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything()


class _MissingModule(types.ModuleType):
    __version__ = "0.0.0"

    def __getattr__(self, name: str) -> _Anything:
        if (name.startswith("__") and name.endswith("__")) or name in ABSENT_ATTRIBUTES:
            raise AttributeError(name)
        return _Anything()


class MissingModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last-resort finder: a stand-in for any third-party module that no other finder can load."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        top = fullname.partition(".")[0]
        if top in NEVER_STUBBED or top in sys.stdlib_module_names:
            return None
        for finder in sys.meta_path:
            if finder is not self and getattr(finder, "find_spec", None) and finder.find_spec(fullname, path):
                return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _MissingModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _parser_prog(server_args_file: Path) -> str | None:
    """The prog= that this version's prepare_server_args() gives its parser (None: argparse's default)."""
    found = re.search(r'ArgumentParser\(prog="([^"]+)"\)', server_args_file.read_text())
    return found.group(1) if found else None


def build_parser() -> argparse.ArgumentParser:
    sys.meta_path.append(MissingModuleFinder())
    from sglang.srt import server_args  # the installed, unmodified module

    # without prog=, argparse names itself after sys.argv[0]: launch_server.py under `python -m`
    parser = argparse.ArgumentParser(prog=_parser_prog(Path(server_args.__file__)) or "launch_server.py")
    server_args.ServerArgs.add_cli_args(parser)
    return parser


def main(argv: list[str]) -> NoReturn:
    parser = build_parser()
    namespace = parser.parse_args(argv)  # exits 2 with "unrecognized arguments: ..." like the server
    print(RESULT_MARKER + json.dumps(vars(namespace), default=str), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main(json.load(sys.stdin))
