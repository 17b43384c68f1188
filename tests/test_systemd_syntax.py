"""The systemd syntax reader against the rules and examples of systemd's own manual pages.

Expected values come from systemd.syntax(7), systemd.service(5) "Command lines", systemd.unit(5)
"Specifiers" and systemd.exec(5) "EnvironmentFile=" (systemd 252); test_render.py checks the same
reader against the real systemd binaries.
"""

from __future__ import annotations

import pytest
from helpers.systemd_syntax import (
    SystemdSyntaxError,
    exec_start_argv,
    expand_environment,
    parse_env_file,
    parse_exec,
    parse_unit_file,
    resolve_specifiers,
)

from deploy_lib.errors import ConfigError


def argvs(rvalue: str) -> list[tuple[str, ...]]:
    return [command.argv for command in parse_exec(rvalue)]


def test_unit_file_comments_continuations_and_repeated_keys() -> None:
    unit = parse_unit_file(
        "\ufeff# comment\n[Unit]\nDescription = spaced out  \n\n[Service]\n"
        "ExecStart=/bin/echo a \\\n   ; ignored comment inside a continuation\n  b\n"
        "Environment=A=1\r\nEnvironment=B=2\n  # indented comment\n"
    )
    assert unit.values("Unit", "Description") == ("spaced out",)
    assert unit.values("Service", "ExecStart") == ("/bin/echo a    b",)
    assert unit.values("Service", "Environment") == ("A=1", "B=2")
    assert unit.values("Service", "User") == ()


def test_an_even_number_of_trailing_backslashes_does_not_continue_the_line() -> None:
    unit = parse_unit_file('[Service]\nExecStart=/bin/echo "x\\\\"\nUser=root\n')
    assert unit.values("Service", "ExecStart") == ('/bin/echo "x\\\\"',)
    assert unit.values("Service", "User") == ("root",)


@pytest.mark.parametrize("text", ["Key=outside\n", "[Service]\nno equals sign\n", "[Service\nA=1\n"])
def test_malformed_unit_files_are_refused(text: str) -> None:
    with pytest.raises(SystemdSyntaxError):
        parse_unit_file(text)


def test_syntax_errors_are_config_errors() -> None:
    assert issubclass(SystemdSyntaxError, ConfigError)


def test_manual_semicolon_examples() -> None:
    # systemd.service(5): "echo one ; echo "two two"" runs echo twice.
    assert argvs('echo one ; echo "two two"') == [("echo", "one"), ("echo", "two two")]
    # systemd.service(5): "echo / >/dev/null & \; \<newline>ls" is one command with five arguments.
    unit = parse_unit_file("[Service]\nExecStart=echo / >/dev/null & \\; \\\nls\n")
    assert argvs(unit.values("Service", "ExecStart")[0]) == [("echo", "/", ">/dev/null", "&", ";", "ls")]


@pytest.mark.parametrize(("rvalue", "expected"), [
    ('/bin/x ";"', ("/bin/x", ";")),
    ("/bin/x ';'", ("/bin/x", ";")),
    ("/bin/x a;", ("/bin/x", "a;")),
    ("/bin/x ;a", ("/bin/x", ";a")),
])
def test_only_a_lone_unquoted_semicolon_separates(rvalue: str, expected: tuple[str, ...]) -> None:
    assert argvs(rvalue) == [expected]


def test_every_escape_of_the_quoting_table() -> None:
    # systemd.syntax(7), table "Supported escapes".
    line = r'/bin/x "\a\b\f\n\r\t\v\\\"\'\s" "\x41\101\u00e9\U0001F680"'
    assert argvs(line) == [("/bin/x", "\a\b\f\n\r\t\v\\\"' ", "AAé\U0001F680")]


def test_escapes_work_unquoted_and_inside_single_quotes_and_raw_bytes_join_into_utf8() -> None:
    assert argvs(r"/bin/x a\sb 'c\td' \xc3\xa9") == [("/bin/x", "a b", "c\td", "é")]


def test_adjacent_quoted_parts_form_one_word_and_empty_quotes_are_a_word() -> None:
    assert argvs("/bin/x a\"b c\"'d' \"\" ''") == [("/bin/x", "ab cd", "", "")]


@pytest.mark.parametrize("rvalue", ['/bin/x "open', r"/bin/x \q", r"/bin/x \x4", r"/bin/x \x00", "/bin/x end\\"])
def test_bad_quoting_or_escapes_are_refused(rvalue: str) -> None:
    with pytest.raises(SystemdSyntaxError):
        parse_exec(rvalue)


def test_executable_prefixes_are_split_off() -> None:
    (command,) = parse_exec("-:/bin/x a")
    assert (command.prefixes, command.path, command.argv) == ("-:", "/bin/x", ("/bin/x", "a"))
    (command,) = parse_exec("@/bin/x name a")
    assert (command.path, command.argv) == ("/bin/x", ("name", "a"))


@pytest.mark.parametrize("rvalue", ['"/bin/a\\"b"', "'/bin/a\\\\b'", "/bin/dir/"])
def test_executables_with_quotes_backslashes_or_a_trailing_slash_are_refused(rvalue: str) -> None:
    with pytest.raises(SystemdSyntaxError):
        parse_exec(rvalue)


def test_specifiers() -> None:
    # systemd.unit(5): "%%" is a single percent sign; letters are specifiers; other "%" stay.
    assert resolve_specifiers("100%% %-x %") == "100% %-x %"
    assert resolve_specifiers("%n.d", {"n": "sglang.service"}) == "sglang.service.d"
    with pytest.raises(SystemdSyntaxError, match="%n"):
        resolve_specifiers("%n")
    assert argvs('/bin/x "%%n" 50%%') == [("/bin/x", "%n", "50%")]


def test_manual_variable_examples() -> None:
    # systemd.service(5): ExecStart=echo $ONE $TWO ${TWO} with ONE=one, TWO="two two".
    environment = {"ONE": "one", "TWO": "two two"}
    (command,) = parse_exec("echo $ONE $TWO ${TWO}")
    assert expand_environment(command.argv, environment) == ("echo", "one", "two", "two", "two two")
    # systemd.service(5): ONE='one', TWO="'two two' too", THREE= (empty).
    environment = {"ONE": "'one'", "TWO": "'two two' too", "THREE": ""}
    (braced,) = parse_exec("/bin/echo ${ONE} ${TWO} ${THREE}")
    (bare,) = parse_exec("/bin/echo $ONE $TWO $THREE")
    assert expand_environment(braced.argv, environment) == ("/bin/echo", "'one'", "'two two' too", "")
    assert expand_environment(bare.argv, environment) == ("/bin/echo", "one", "two two", "too")


@pytest.mark.parametrize(("word", "expected"), [
    ("$$", "$"), ("a$$b", "a$b"), ("$${X}", "${X}"), ("pre${X}post", "prexpost"), ("${UNSET}", ""),
    ("a$X", "a$X"), ("${X:-d}", "${X:-d}"), ("${X", "${X"), ("cost$", "cost$"),
])
def test_dollar_substitution_inside_a_word(word: str, expected: str) -> None:
    assert expand_environment(("/bin/x", word), {"X": "x"}) == ("/bin/x", expected)


def test_a_whole_word_variable_that_is_unset_disappears() -> None:
    assert expand_environment(("/bin/x", "$UNSET", "$", "after"), {}) == ("/bin/x", "after")


def test_exec_start_argv_needs_exactly_one_command() -> None:
    assert exec_start_argv('[Service]\nExecStart=/bin/x "$$HOME"\n') == ("/bin/x", "$HOME")
    with pytest.raises(SystemdSyntaxError, match="found 2"):
        exec_start_argv("[Service]\nExecStart=/bin/x ; /bin/y\n")


def test_env_file_unquoted_values() -> None:
    # systemd.exec(5): leading/trailing whitespace dropped, interior kept, quotes after the first character
    # kept, backslash keeps the next character, backslash-newline continues the line.
    text = "A=  x  y  \nB=a\"b\" 'c'\nC=\\\\ \\$x\nD=one \\\ntwo\nE=tail\\ \n"
    assert parse_env_file(text) == {"A": "x  y", "B": "a\"b\" 'c'", "C": "\\ $x", "D": "one two", "E": "tail "}


def test_env_file_single_quotes_are_verbatim_and_span_lines() -> None:
    assert parse_env_file("A='x \\n $y \"z\"\nnext'\n") == {"A": 'x \\n $y "z"\nnext'}


def test_env_file_double_quotes_escape_only_shell_characters() -> None:
    text = 'A="q\\" b\\\\ t\\` d\\$ other\\n kept"\nB="multi\nline"\nC="joined\\\nhere"\n'
    assert parse_env_file(text) == {"A": 'q" b\\ t` d$ other\\n kept', "B": "multi\nline", "C": "joinedhere"}


def test_env_file_quoted_parts_concatenate_and_surrounding_whitespace_is_dropped() -> None:
    assert parse_env_file("A= \"x\" 'y' \n") == {"A": "xy"}


def test_env_file_comments_blank_lines_and_lines_without_equals_are_ignored() -> None:
    text = "# c\n\n ; also a comment\nJUNK\n  NAME = value\n# continued \\\nHIDDEN=1\nEMPTY=\n"
    assert parse_env_file(text) == {"NAME": "value", "EMPTY": ""}


def test_env_file_does_not_expand_variables_or_specifiers() -> None:
    assert parse_env_file('A=$HOME %n ${X}\nB="$$ %%"\n') == {"A": "$HOME %n ${X}", "B": "$$ %%"}


def test_env_file_later_assignment_wins() -> None:
    assert parse_env_file("A=1\nB=2\nA=3\n") == {"A": "3", "B": "2"}
