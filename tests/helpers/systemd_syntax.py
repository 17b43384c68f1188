"""Read unit files, ExecStart= lines and environment files back the way systemd does.

Written from systemd's documentation (systemd.syntax(7) "Quoting", systemd.service(5) "Command lines",
systemd.unit(5) "Specifiers", systemd.exec(5) "EnvironmentFile=") and checked against the behaviour of
systemd 252 (Debian 12): src/shared/conf-parser.c, src/basic/extract-word.c, src/basic/escape.c,
src/core/load-fragment.c (config_parse_exec), src/shared/specifier.c, src/basic/env-util.c
(replace_env_argv) and src/basic/env-file.c. The tests' oracle: rendered units and env files read back.

Where systemd would log a warning and carry on (an unknown escape, unbalanced quotes, a line without
`=`), this module raises SystemdSyntaxError instead: a file we rendered never does that.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass

from deploy_lib.errors import ConfigError

WHITESPACE = " \t\n\r"
COMMENT_STARTS = "#;"
SHELL_ESCAPED = '"\\`$'
SPECIFIER_CHARS = string.ascii_letters + string.digits + "%"
SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
                  "\\": "\\", '"': '"', "'": "'", "s": " "}
EXEC_PREFIXES = "-@:+!"
LINE_BREAK = re.compile(r"\r\n|\r|\n")


class SystemdSyntaxError(ConfigError):
    """Text that systemd would reject or read only with a warning."""


@dataclass(frozen=True)
class UnitFile:
    """Assignments of a unit file in file order: (section, key, raw value)."""

    entries: tuple[tuple[str, str, str], ...]

    def values(self, section: str, key: str) -> tuple[str, ...]:
        return tuple(value for sect, name, value in self.entries if (sect, name) == (section, key))


@dataclass(frozen=True)
class ExecCommand:
    """One command of an Exec*= setting before variable substitution: `$` is still `$`/`$$` here."""

    path: str
    argv: tuple[str, ...]
    prefixes: str  # the special executable prefixes used, e.g. "-" or ":"


def parse_unit_file(text: str) -> UnitFile:
    """Sections and assignments; comments dropped, continuation lines joined, whitespace stripped."""
    entries: list[tuple[str, str, str]] = []
    section: str | None = None
    for number, logical in _logical_lines(text):
        line = logical.strip(WHITESPACE)
        if not line:
            continue
        if line.startswith("["):
            if not line.endswith("]") or len(line) < 3:
                raise SystemdSyntaxError(f"line {number}: invalid section header {line!r}")
            section = line[1:-1]
            continue
        key, equals, value = line.partition("=")
        if not equals:
            raise SystemdSyntaxError(f"line {number}: missing '=' in {line!r}")
        if section is None:
            raise SystemdSyntaxError(f"line {number}: assignment {key.strip()!r} outside of any section")
        entries.append((section, key.strip(WHITESPACE), value.strip(WHITESPACE)))
    return UnitFile(tuple(entries))


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(number of the last physical line, text) with backslash-continued lines joined by a space."""
    lines: list[tuple[int, str]] = []
    pending = ""
    number = 0
    for number, physical in enumerate(LINE_BREAK.split(text.removeprefix("\ufeff")), start=1):
        if physical.lstrip(WHITESPACE)[:1] in tuple(COMMENT_STARTS):
            continue  # a comment line is skipped even in the middle of a continued line
        joined = pending + physical
        if _ends_in_escape(joined):
            pending = joined[:-1] + " "
        else:
            lines.append((number, joined))
            pending = ""
    if pending:
        lines.append((number, pending))
    return lines


def _ends_in_escape(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def resolve_specifiers(text: str, specifiers: Mapping[str, str] | None = None) -> str:
    """Expand `%x`: `%%` is `%`, a known letter is looked up, any other letter is an error, other `%` stay."""
    known = specifiers or {}
    out: list[str] = []
    position = 0
    while position < len(text):
        char = text[position]
        follower = text[position + 1:position + 2]
        if char != "%" or not follower:
            out.append(char)
            position += 1
        elif follower == "%":
            out.append("%")
            position += 2
        elif follower in known:
            out.append(known[follower])
            position += 2
        elif follower in SPECIFIER_CHARS:
            raise SystemdSyntaxError(f"specifier %{follower} in {text!r} needs a unit to expand")
        else:
            out.append(char + follower)
            position += 2
    return "".join(out)


def _unescape_one(text: str, start: int) -> tuple[bytes, int]:
    """The bytes of the C escape whose letter is at text[start], and the index after the escape."""
    letter = text[start:start + 1]
    if letter in SIMPLE_ESCAPES:
        return SIMPLE_ESCAPES[letter].encode(), start + 1
    if not letter or letter not in "xuU01234567":
        raise SystemdSyntaxError(f"unknown escape sequence {text[start - 1:start + 1]!r} in {text!r}")
    digits, first = {"x": (2, start + 1), "u": (4, start + 1), "U": (8, start + 1)}.get(letter, (3, start))
    chunk = text[first:first + digits]
    allowed = "01234567" if letter not in "xuU" else string.hexdigits
    if len(chunk) != digits or any(char not in allowed for char in chunk):
        raise SystemdSyntaxError(f"malformed escape {text[start - 1:first + digits]!r} in {text!r}")
    code = int(chunk, 8 if letter not in "xuU" else 16)
    if code == 0 or code > (0x10FFFF if letter in "uU" else 0xFF):
        raise SystemdSyntaxError(f"escape {text[start - 1:first + digits]!r} is NUL or out of range")
    if letter in "uU":
        try:
            return chr(code).encode(), first + digits
        except UnicodeEncodeError as error:
            raise SystemdSyntaxError(f"escape {text[start - 1:first + digits]!r} is not a character") from error
    return bytes([code]), first + digits  # \xNN and \NNN are raw bytes, as in C


def extract_words(text: str, *, c_unescape: bool, relax: bool = False,
                  limit: int | None = None) -> tuple[list[str], str]:
    """Split at whitespace honouring '…' and "…" (quotes removed) and backslashes; at most `limit` words.

    Returns the words and the unparsed rest (which starts at a non-whitespace character, or is empty).
    A backslash escapes inside quotes too: with c_unescape it starts a C escape (\\n, \\x41, \\u00e9,
    \\s, ...), without it keeps the next character. `relax` accepts an unbalanced quote or a trailing
    backslash by ending the word there, as systemd does when it splits a `$VAR` word.
    """
    words: list[str] = []
    position = len(text) - len(text.lstrip(WHITESPACE))
    while position < len(text) and (limit is None or len(words) < limit):
        word = bytearray()
        quote = ""
        while position < len(text):
            char = text[position]
            if char == "\\":
                if position + 1 >= len(text):
                    if relax:
                        position += 1
                        break
                    raise SystemdSyntaxError(f"trailing backslash in {text!r}")
                if c_unescape:
                    decoded, position = _unescape_one(text, position + 1)
                    word += decoded
                else:
                    word += text[position + 1].encode()
                    position += 2
            elif quote:
                if char != quote:
                    word += char.encode()
                else:
                    quote = ""
                position += 1
            elif char in "'\"":
                quote = char
                position += 1
            elif char in WHITESPACE:
                break
            else:
                word += char.encode()
                position += 1
        if quote and not relax:
            raise SystemdSyntaxError(f"unbalanced quoting in {text!r}")
        try:
            words.append(word.decode())
        except UnicodeDecodeError as error:
            raise SystemdSyntaxError(f"escapes in {text!r} do not form valid UTF-8") from error
        position += len(text[position:]) - len(text[position:].lstrip(WHITESPACE))
    return words, text[position:]


def parse_exec(rvalue: str, specifiers: Mapping[str, str] | None = None) -> tuple[ExecCommand, ...]:
    """The commands of one ExecStart= value: words unquoted and unescaped, then specifiers resolved.

    A lone unquoted `;` separates commands and `\\;` is a literal `;` word, as in systemd.service(5).
    """
    commands: list[ExecCommand] = []
    rest = rvalue
    while True:
        first, rest = extract_words(rest, c_unescape=True, limit=1)
        if not first:
            return tuple(commands)
        if first[0] == ";":
            continue
        prefixes, executable = _split_prefixes(first[0])
        path = resolve_specifiers(executable, specifiers)
        if not path or any(ord(char) < 0x20 or char in "\"'\\\x7f" for char in path) or path.endswith("/"):
            raise SystemdSyntaxError(f"invalid executable {path!r} in {rvalue!r}")
        argv = [] if "@" in prefixes else [path]
        while rest:
            if rest[0] == ";" and rest[1:2] in ("", *WHITESPACE):
                rest = rest[1:].lstrip(WHITESPACE)
                break
            if rest.startswith("\\;") and rest[2:3] in ("", *WHITESPACE):
                argv.append(";")
                rest = rest[2:].lstrip(WHITESPACE)
                continue
            word, rest = extract_words(rest, c_unescape=True, limit=1)
            argv.extend(resolve_specifiers(each, specifiers) for each in word)
        if not argv:
            raise SystemdSyntaxError(f"no argv[0] in {rvalue!r}")
        commands.append(ExecCommand(path=path, argv=tuple(argv), prefixes=prefixes))


def _split_prefixes(word: str) -> tuple[str, str]:
    """Leading executable prefixes (`-@:+!`, each once; "!!" is a prefix of its own) and the rest."""
    prefixes = ""
    for char in word:
        second_bang = char == "!" and prefixes.count("!") == 1
        if char not in EXEC_PREFIXES or (char in prefixes and not second_bang):
            break
        prefixes += char
    return prefixes, word[len(prefixes):]


def _substitute(word: str, environment: Mapping[str, str]) -> str:
    """`$$` -> `$`, `${NAME}` -> its value (empty if unset); anything else with `$` stays as written."""
    out: list[str] = []
    position = 0
    while position < len(word):
        if word.startswith("$$", position):
            out.append("$")
            position += 2
        elif word.startswith("${", position):
            end = position + 2
            while end < len(word) and word[end] not in "}:":
                end += 1
            if end < len(word) and word[end] == "}":
                out.append(environment.get(word[position + 2:end], ""))
                position = end + 1
            else:  # `${NAME:-x}` is not supported here and `${NAME` is unterminated: both stay literal
                out.append(word[position:end + 1])
                position = end + 1
        elif word[position] == "$":
            out.append(word[position:position + 2])  # `$x` inside a word is literal
            position += 2
        else:
            out.append(word[position])
            position += 1
    return "".join(out)


def expand_environment(argv: tuple[str, ...], environment: Mapping[str, str]) -> tuple[str, ...]:
    """The argv systemd executes: a word `$NAME` becomes the value split into words, others substituted."""
    expanded: list[str] = []
    for word in argv:
        if word.startswith("$") and word[1:2] not in ("{", "$"):
            value = environment.get(word[1:])
            if value is not None:
                expanded.extend(extract_words(value, c_unescape=False, relax=True)[0])
        else:
            expanded.append(_substitute(word, environment))
    return tuple(expanded)


def exec_start_argv(unit_text: str, environment: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The argv systemd would execute for a unit with exactly one ExecStart= command."""
    values = parse_unit_file(unit_text).values("Service", "ExecStart")
    commands = [command for value in values for command in parse_exec(value)]
    if len(commands) != 1:
        raise SystemdSyntaxError(f"expected exactly one ExecStart= command, found {len(commands)}")
    return expand_environment(commands[0].argv, environment or {})


def parse_env_file(text: str) -> dict[str, str]:
    """Assignments of an EnvironmentFile=, in file order (a repeated name keeps its first place).

    Outside quotes a backslash keeps the next character and leading/trailing whitespace is dropped;
    '…' is verbatim; in "…" a backslash escapes only `"`, `\\`, `` ` `` and `$` (before anything else it
    stays); backslash-newline joins lines; `#` or `;` before a name starts a comment; no `$` expansion.
    """
    result: dict[str, str] = {}
    position = 0
    while position < len(text):
        char = text[position]
        if char in WHITESPACE:
            position += 1
        elif char in COMMENT_STARTS:
            position = _skip_comment(text, position)
        else:
            position = _read_assignment(text, position, result)
    return result


def _skip_comment(text: str, position: int) -> int:
    while position < len(text) and text[position] not in "\n\r":
        position += 2 if text[position] == "\\" else 1  # an escaped line break continues the comment
    return position


def _read_assignment(text: str, position: int, result: dict[str, str]) -> int:
    name_end = position
    while name_end < len(text) and text[name_end] not in "=\n\r":
        name_end += 1
    if name_end >= len(text) or text[name_end] != "=":
        return name_end  # a line without '=' is ignored
    name = text[position:name_end].rstrip(WHITESPACE)
    value, position = _read_value(text, name_end + 1)
    result[name] = value
    return position


def _read_value(text: str, position: int) -> tuple[str, int]:
    """The value starting after '=' and the index of the line break that ends it.

    Quoted parts may follow each other ('a'"b" is ab, whitespace between them is dropped); from the first
    other character on, the rest of the line is taken as written (quotes included) apart from backslashes.
    """
    value: list[str] = []
    as_written = False
    trailing_space_from: int | None = None  # where unquoted trailing whitespace starts in `value`
    while position < len(text) and text[position] not in "\n\r":
        char = text[position]
        if as_written:
            if char == "\\":
                escaped = text[position + 1:position + 2]
                if escaped not in ("", "\n", "\r"):  # an escaped line break joins lines
                    value.append(escaped)
                position += 2
                trailing_space_from = None
                continue
            if char not in WHITESPACE:
                trailing_space_from = None
            elif trailing_space_from is None:
                trailing_space_from = len(value)
            value.append(char)
            position += 1
        elif char == "'":
            end = text.find("'", position + 1)
            end = len(text) if end < 0 else end
            value.append(text[position + 1:end])
            position = end + 1
        elif char == '"':
            position = _read_double_quoted(text, position + 1, value)
        elif char in WHITESPACE:
            position += 1
        else:
            as_written = True
    if trailing_space_from is not None:
        del value[trailing_space_from:]
    return "".join(value), position


def _read_double_quoted(text: str, position: int, value: list[str]) -> int:
    while position < len(text) and text[position] != '"':
        char = text[position]
        if char == "\\":
            escaped = text[position + 1:position + 2]
            if escaped and escaped in SHELL_ESCAPED:
                value.append(escaped)
            elif escaped != "\n":
                value.append(char + escaped)
            position += 2
        else:
            value.append(char)
            position += 1
    return position + 1
