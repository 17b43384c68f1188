"""An SGLang argv checked locally against the launch options that deploy_lib/host_scripts/sglang_options.py read on
the host.

`check_argv(options, argv)` mimics argparse (allow_abbrev=True, as SGLang's parser) closely enough for preflight:
unknown or ambiguous flags, prefix abbreviations, missing values, values given to switches, bad choices;
`parse_argv` also returns each option with its values (adopt reads a hand-run server's argv with it), and
`build_parser` builds a real argparse parser from the same records (the simulated server and tests use it as a
second opinion). Never sent to the host: an edit here leaves the hosts' cached SGLang facts valid.
"""

from __future__ import annotations

import argparse
import difflib
import re
from dataclasses import dataclass
from typing import Any

_REPEATABLE_ACTIONS = {"append", "append_const", "count", "extend"}

@dataclass(frozen=True)
class ArgvProblem:
    """One thing SGLang's parser would reject (severity "error") or warn about ("warning") in an argv."""

    kind: str  # unrecognized | ambiguous | abbreviation | missing-value | unexpected-value | invalid-choice |
    #            invalid-type | required | refused | duplicate | help | deprecated
    arg: str
    message: str
    severity: str = "error"


_HELP = {"option_strings": ["-h", "--help"], "dest": "help", "action": "help", "nargs": 0, "choices": None,
         "type": None, "required": False, "deprecated": False, "error": None}
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _is_value(token: str, table: dict[str, dict[str, Any]]) -> bool:
    """argparse's test for a token that is not an option (`_parse_optional` returning None)."""
    if not token.startswith("-") or token == "-":
        return True
    name = token.split("=", 1)[0]
    if token in table or name in table or (token.startswith("--") and any(s.startswith(name) for s in table)):
        return False
    return bool(_NEGATIVE_NUMBER.match(token)) or " " in token  # SGLang has no option that looks like a number


def convert_value(value: str, type_name: str | None) -> Any:
    """A value as the option's type would give it (int and float; anything else stays text)."""
    if type_name == "int":
        return int(value)
    if type_name == "float":
        return float(value)
    return value


@dataclass(frozen=True)
class ParsedArg:
    """One option as argparse would read it from an argv: its record (None: unknown), the option string it matched
    (the full one for an abbreviation), its values, and the tokens exactly as written."""

    record: dict[str, Any] | None
    used: str
    values: tuple[str, ...]
    tokens: tuple[str, ...]


def check_argv(options: dict[str, dict[str, Any]], argv: list[str] | tuple[str, ...]) -> list[ArgvProblem]:
    """Problems SGLang's argparse parser would have with argv (the arguments after `-m sglang.launch_server`)."""
    return parse_argv(options, argv)[1]


def parse_argv(options: dict[str, dict[str, Any]], argv: list[str] | tuple[str, ...]
               ) -> tuple[list[ParsedArg], list[ArgvProblem]]:
    """argv read as SGLang's argparse parser reads it: each option with its values, and the problems it would have."""
    table: dict[str, dict[str, Any]] = {"-h": _HELP, "--help": _HELP}
    for option in options.values():
        for string in option["option_strings"]:
            table[string] = option
    problems: list[ArgvProblem] = []
    parsed: list[ParsedArg] = []
    seen: dict[str, int] = {}
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        start = i
        i += 1
        if token == "--" or _is_value(token, table):
            rest = tokens[i - 1:] if token == "--" else [token]
            if token == "--":
                i = len(tokens)
            problems.append(ArgvProblem("unrecognized", token, f"unrecognized arguments: {' '.join(rest)}"))
            parsed.append(ParsedArg(None, token, (), tuple(rest)))
            continue
        record, used, explicit, problem = _match_option(token, table)
        if record is None and problem is None:
            unknown = [token]  # argparse lists the values after an unknown flag as unrecognized too
            while i < len(tokens) and _is_value(tokens[i], table):
                unknown.append(tokens[i])
                i += 1
            problem = ArgvProblem("unrecognized", token,
                                  f"unrecognized arguments: {' '.join(unknown)}{_suggestion(used, table)}")
        if problem is not None:
            problems.append(problem)
        if record is None:
            parsed.append(ParsedArg(None, used, (), tuple(tokens[start:i])))
            continue
        values: list[str] = []
        nargs = record["nargs"]
        if explicit is not None:
            if nargs == 0:
                problems.append(ArgvProblem("unexpected-value", token,
                                            f"argument {used}: ignored explicit argument {explicit!r}"))
            elif isinstance(nargs, int) and nargs > 1:
                problems.append(ArgvProblem("missing-value", token, f"argument {used}: expected {nargs} arguments"))
            values = [explicit]
        elif nargs != 0:
            limit = {None: 1, "?": 1, "*": len(tokens), "+": len(tokens)}.get(nargs, nargs)
            while i < len(tokens) and len(values) < limit and _is_value(tokens[i], table):
                values.append(tokens[i])
                i += 1
            needed = {None: 1, "?": 0, "*": 0, "+": 1}.get(nargs, nargs)
            if len(values) < needed:
                what = "one argument" if nargs is None else "at least one argument" if nargs == "+" \
                    else f"{nargs} arguments"
                problems.append(ArgvProblem("missing-value", token, f"argument {used}: expected {what}"))
        elif i < len(tokens) and _is_value(tokens[i], table):
            problems.append(ArgvProblem("unexpected-value", tokens[i],
                                        f"unrecognized arguments: {tokens[i]} ({used} is a switch and takes no value)"))
            i += 1
        problems.extend(_value_problems(record, used, values))
        parsed.append(ParsedArg(record, used, tuple(values), tuple(tokens[start:i])))
        key = record["option_strings"][0]
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 2 and record["action"] not in _REPEATABLE_ACTIONS:
            problems.append(ArgvProblem("duplicate", token, f"{key} is given more than once; the last one wins"))
    missing = [r["option_strings"][0] for r in options.values() if r["required"] and r["option_strings"][0] not in seen]
    if missing:
        problems.append(ArgvProblem("required", missing[0],
                                    f"the following arguments are required: {', '.join(missing)}"))
    return parsed, problems


def find_option(options: dict[str, dict[str, Any]], flag: str) -> dict[str, Any] | None:
    """The option registered under `flag` as any of its option strings (aliases included), or None."""
    return next((record for record in options.values() if flag in record["option_strings"]), None)


def _match_option(token: str, table: dict[str, dict[str, Any]]
                  ) -> tuple[dict[str, Any] | None, str, str | None, ArgvProblem | None]:
    """(record, option string used, explicit `=value`, problem) for a token that looks like an option; record and
    problem are both None for an unknown flag."""
    if token in table:
        return table[token], token, None, None
    name, sep, explicit = token.partition("=")
    if sep and name in table:
        return table[name], name, explicit, None
    matches = sorted(s for s in table if s.startswith(name)) if token.startswith("--") else []
    if len(matches) > 1:
        return None, name, None, ArgvProblem(
            "ambiguous", token, f"ambiguous option: {name} could match {', '.join(matches)}")
    if len(matches) == 1:
        full = matches[0]
        return table[full], full, explicit if sep else None, ArgvProblem(
            "abbreviation", token,
            f"{name} is accepted only as an abbreviation of {full}; write {full} (a later flag starting with "
            f"{name} would make it ambiguous)")
    return None, name, None, None


def _suggestion(name: str, table: dict[str, dict[str, Any]]) -> str:
    close = difflib.get_close_matches(name, [s for s in table if s.startswith("--")], n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _value_problems(record: dict[str, Any], used: str, values: list[str]) -> list[ArgvProblem]:
    problems = []
    if record["action"] == "help":
        problems.append(ArgvProblem("help", used, f"{used} prints the help text and exits instead of serving"))
    if record["error"]:
        problems.append(ArgvProblem("refused", used, f"{used}: {record['error']}"))
    elif record["deprecated"]:
        problems.append(ArgvProblem("deprecated", used, f"{used} is deprecated in this SGLang version", "warning"))
    for value in values:
        try:
            converted = convert_value(value, record["type"])
        except ValueError:
            problems.append(ArgvProblem("invalid-type", value, f"argument {used}: invalid {record['type']} value: "
                                                               f"{value!r}"))
            continue
        choices = record["choices"]
        if choices is not None and converted not in choices and str(converted) not in map(str, choices):
            listed = ", ".join(repr(c) for c in choices)
            problems.append(ArgvProblem("invalid-choice", value,
                                        f"argument {used}: invalid choice: {value!r} (choose from {listed})"))
    return problems


# ---------------------------------------------------------------------------------------------------------------
# A real argparse parser from extracted options (the simulated server and tests use it as a second opinion)
# ---------------------------------------------------------------------------------------------------------------


class _Refused(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, error_message: str = "", **kwargs: Any) -> None:
        self.error_message = error_message
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None) -> None:
        parser.error(self.error_message)


def build_parser(options: dict[str, dict[str, Any]], prog: str = "sglang serve") -> argparse.ArgumentParser:
    """An argparse parser accepting what the extracted options accept (types int/float checked, others as str)."""
    parser = argparse.ArgumentParser(prog=prog)
    types = {"int": int, "float": float}
    for record in options.values():
        strings, dest = record["option_strings"], record["dest"]
        kwargs: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS}
        if record["error"]:
            parser.add_argument(*strings, action=_Refused, error_message=record["error"], **kwargs)
        elif record["action"] == "BooleanOptionalAction":
            positive = [s for s in strings if not s.startswith("--no-")]
            parser.add_argument(*positive, action=argparse.BooleanOptionalAction, **kwargs)
        elif record["nargs"] == 0:
            action = {"store_false": "store_false", "count": "count"}.get(record["action"], "store_const")
            const: dict[str, Any] = {"const": True} if action == "store_const" else {}
            parser.add_argument(*strings, action=action, **const, **kwargs)
        else:
            action = record["action"] if record["action"] in ("append", "extend") else "store"
            parser.add_argument(*strings, action=action, nargs=record["nargs"], choices=record["choices"],
                                type=types.get(record["type"] or "", str), required=record["required"], **kwargs)
    return parser
