"""`sglang-deploy`: the user tasks of the installed package (deploy_cli.collection) under the tool's own name, in
any project directory (found from the working directory, or `--project DIR`), with `--version`. No tasks.py is
looked for: the checkout's tasks.py is for `invoke` there (it adds the sandbox and demo).

The program is invoke's Program with the habits of a deploy tool: one task per command, `--dry` meaning the task's
--dry-run, help of its own (what it is, the tasks by family, only the options that apply, every value shown), usage
errors exit 2 whoever finds them, nothing on the line guessed at (check_line: an option without its value, one
given twice, an unknown task or flag with the nearest name), a word after deploy/render/plan is the profile, and
output cut by a closed pipe (`| head`) ends quietly. OneTaskExecutor carries the first two, the pipe and the check of
an option without its value to the checkout's `invoke` as well (invoke.yaml names it)."""

from __future__ import annotations

import difflib
import os
import re
import sys
from importlib.metadata import version
from typing import Any, NoReturn

from invoke import Argument, Executor, Exit, ParseError, Parser, Program
from invoke.parser import ParserContext
from invoke.util import Lexicon

from deploy_lib.errors import EXIT_CODES, ConfigError, did_you_mean

NAME = "sglang-deploy"
USAGE_ERROR = EXIT_CODES[ConfigError]  # 2: nothing was run
PIPE_CLOSED = 1  # as Python's recipe (library/signal.html, note on SIGPIPE) and rich's Console.on_broken_pipe end
HIDDEN_CORE = ("complete",)  # what the completion script calls; nobody types it
COMPLETION_SHELLS = ("bash", "zsh", "fish")  # the scripts invoke ships (invoke/completion/)
DRIFT_CHECK = "detailed_exitcode"  # plan's Terraform contract: 2 means "changes", so a usage error there is 1


def usage_code(drift_check: bool) -> int:
    return 1 if drift_check else USAGE_ERROR


def stdout_gone() -> NoReturn:
    """The reader of stdout went away (`| head`): stop without a traceback. Later writes, and the flush at exit, go
    to /dev/null, or Python would report the broken pipe once more on its way out."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise Exit(code=PIPE_CLOSED)


class OneTaskExecutor(Executor):
    """Runs the one task of a command line. A second task is refused before anything runs (invoke would run both:
    `render -p glm5-nvfp4 uninstall` uninstalled); invoke's `--dry` (`-R`) is the task's --dry-run or refused (invoke
    echoes the shell commands of `c.run`, which no task uses, so a real deploy ran)."""

    line_checked = False  # by the program: `sglang-deploy` checks the line before invoke's parser reads it

    def execute(self, *tasks: Any) -> dict[Any, Any]:
        contexts = [each for each in tasks if isinstance(each, ParserContext)]
        code = usage_code(any(DRIFT_CHECK in each.args and each.args[DRIFT_CHECK].value for each in contexts))
        if self.core is not None and not self.line_checked:  # the checkout's `invoke`: invoke's parser alone
            try:
                check_line(list(self.core.unparsed), Parser(self.collection.to_contexts()).contexts, self.core[0])
            except ParseError as error:
                raise _refused(Exit(f"error: {error}", code=code), error, list(self.core.unparsed)) from None
        if len(tasks) > 1:
            first, second = (self.typed(each) for each in tasks[:2])
            raise Exit(f"error: one task per command: `{second}` is a second task after `{first}`; nothing was run "
                       "(a value goes after its option: `--host NAME`)", code=code)
        dry = self.core is not None and "dry" in self.core[0].args and self.core[0].args.dry.value
        for context in contexts:
            if dry and "dry_run" not in context.args:
                raise Exit(f"error: --dry (-R) is the task's --dry-run, and `{self.typed(context)}` has none; "
                           "nothing was run", code=code)
            if dry:
                context.args["dry_run"].value = True
        try:
            results: dict[Any, Any] = super().execute(*tasks)
            sys.stdout.flush()
        except BrokenPipeError:
            stdout_gone()
        return results

    def typed(self, task: Any) -> str:
        """The task's name as a user types it (`tune` for tune.tune)."""
        from deploy_cli.usage import shown_name
        return shown_name(self.collection, getattr(task, "name", task))


def _refused(ended: Exit, error: ParseError, tokens: list[str]) -> Exit:
    """A refused line: with --json on it (before any `--`), its one document on stdout too."""
    line = tokens[:tokens.index("--")] if "--" in tokens else tokens
    if "--json" in line:
        from deploy_cli import common
        common.refused_line(error.context.name if error.context is not None and error.context.name else "", ended)
    return ended


def _flag(flag: str, context: ParserContext, initial: ParserContext) -> Argument | None:
    """The task's option, else the program's (invoke reads a program option after the task too)."""
    for each in (context, initial):
        if flag in each.flags:  # a Lexicon: `in` and [] know the short aliases, .get does not
            found: Argument = each.flags[flag]
            return found
    return None


def with_operand(tokens: list[str], contexts: Lexicon, initial: ParserContext, operands: dict[str, str]) -> list[str]:
    """`deploy glm5-nvfp4 -y` as `deploy --profile glm5-nvfp4 -y`: the first bare word after a task that names an
    operand, and is not an option's value, a task's name or after `--`, becomes that option. The word and the
    option both is a ParseError; a word after the option is left for invoke to refuse."""
    result: list[str] = []
    context, word, by_option, waiting = initial, "", False, False
    for index, token in enumerate(tokens):
        operand = operands.get(context.name or "")
        if token == "--":
            return result + tokens[index:]
        if waiting:
            result.append(token)
            waiting = False
            continue
        if token.startswith("-") and token != "-":
            flag, has_value = token.partition("=")[0], "=" in token
            if not flag.startswith("--") and len(flag) > 2:  # a cluster: -ifile (a value), -yv or -yi FILE (flags)
                head = _flag(flag[:2], context, initial)
                if head is not None and head.takes_value:
                    flag, has_value = flag[:2], True
                else:
                    flag = "-" + flag[-1]
            argument = _flag(flag, context, initial)
            if argument is not None and argument.name == operand:
                if word:
                    raise ParseError(f"the {operand} is given twice: as the word {word!r} and by {flag}", context)
                by_option = True
            waiting = argument is not None and argument.takes_value and not argument.optional and not has_value
            result.append(token)
        elif token in contexts:
            context, word, by_option = contexts[token], "", False
            result.append(token)
        elif operand and not word and not by_option:
            result += [f"--{operand}", token]
            word = token
        else:
            result.append(token)
    return result


# Flags a task does not have, typed out of habit (Ansible's) or from another task, and what to type instead; a task
# that has a flag of the same name (`patch --check`) keeps its own.
EXTRA_VARS = "Ansible's extra vars are a profile's values here: `--set path.to.key=value` (deploy, plan, render)"
CHECK_MODE = "Ansible's check mode is `--dry-run` (deploy, tune) or the `plan` task here"
BECOME_PASSWORD = ("Ansible's become password is the inventory's `become_password` here: `ask` (typed once at the "
                   "terminal) or `{env: VAR}`")
ANSWERED = {
    "--limit": "--limit PATTERN (Ansible's host patterns) is an option of the tasks that take both --host and "
               "--group (deploy, status, logs, ...), given after the task",
    "-e": EXTRA_VARS,
    "--extra-vars": EXTRA_VARS,
    "--check": CHECK_MODE,
    "-C": CHECK_MODE,
    "-K": BECOME_PASSWORD,
    "--ask-become-pass": BECOME_PASSWORD,
    "--set": "--set overrides a profile value (deploy, plan, render); a patch set is `--name NAME`",
}


def _long_names(context: ParserContext, initial: ParserContext) -> list[str]:
    """The long flags a user may type in the context (`--profile`; a Lexicon lists no alias such as `-p`)."""
    return [*context.flags, *context.inverse_flags, *initial.flags]


def _is_flag(token: str, context: ParserContext, initial: ParserContext) -> bool:
    """A token that is a flag, not a value: one the context or the program knows, or any `--word`."""
    flag = token.partition("=")[0]
    known = flag in context.flags or flag in context.inverse_flags or flag in initial.flags
    return known or (flag.startswith("--") and len(flag) > 2)


def _unknown_flag(flag: str, context: ParserContext, initial: ParserContext) -> ParseError:
    where = f"`{context.name}`" if context.name else "the program"
    if flag in ANSWERED:
        return ParseError(f"{where} has no option {flag}: {ANSWERED[flag]}", context)
    names = {name.lstrip("-"): name for name in _long_names(context, initial)}  # the dashes would match them all
    close = difflib.get_close_matches(flag.lstrip("-"), list(names), n=1, cutoff=0.6)
    return ParseError(f"{where} has no option {flag}" + "".join(f"; did you mean `{names[name]}`?" for name in close),
                      context)


def check_line(tokens: list[str], contexts: Lexicon, initial: ParserContext) -> None:
    """Refuse what invoke's parser would guess at, naming the flag as typed: an option that takes a value given
    without one (invoke let a repeatable one pass empty: `--serial --dry-run` deployed every host at once), a
    single-value option given twice, an unknown flag or task (with the nearest name), a bare word no option takes.
    A value is the next token unless that is a flag; `--` ends the check."""
    from deploy_cli.usage import option_spec
    context, given, index = initial, dict[str | None, str](), 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token == "--":
            return
        if not token.startswith("-") or token == "-":
            if token in contexts:
                context, given = contexts[token], {}
            elif context is initial:
                raise ParseError(f"no task named {token!r}{did_you_mean(token, list(contexts))}", context)
            else:
                raise ParseError(f"`{context.name}` takes no bare word: {token!r} is no option's value (a value "
                                 "goes after its option: `--host NAME`)", context)
            continue
        flag, has_value = token.partition("=")[0], "=" in token
        if not flag.startswith("--") and len(flag) > 2:  # a cluster: -ifile (a value), -yv or -yi FILE (flags)
            head = _flag(flag[:2], context, initial)
            for short in ([] if head is not None and head.takes_value else flag[1:-1]):
                if _flag("-" + short, context, initial) is None:
                    raise _unknown_flag("-" + short, context, initial)
            flag, has_value = (flag[:2], True) if head is not None and head.takes_value else ("-" + flag[-1],
                                                                                                has_value)
        argument = _flag(context.inverse_flags.get(flag, flag), context, initial)
        if argument is None:
            raise _unknown_flag(flag, context, initial)
        if not argument.takes_value or argument.optional:
            continue
        if has_value:
            value = token.partition("=")[2] if "=" in token else token[2:]
        else:
            following = tokens[index] if index < len(tokens) else None
            if following is None or following == "--" or _is_flag(following, context, initial):
                after = f"before {following}" if following else "at the end of the line"
                shown = option_spec(argument).split(", ")[-1].removesuffix(" ...")
                raise ParseError(f"{flag} needs a value ({shown}): none was "
                                 f"given {after}; nothing was run", context)
            value, index = following, index + 1
        if argument.kind is not list and argument.name in given:
            raise ParseError(f"{flag} is given twice ({given[argument.name]!r}, then {value!r}) and takes one "
                             "value: give it once; nothing was run", context)
        given[argument.name] = value


class CheckedLineExecutor(OneTaskExecutor):
    """`sglang-deploy`'s executor: DeployProgram.parse_tasks has checked the line (check_line) already."""

    line_checked = True


class DeployProgram(Program):
    def core_args(self) -> list[Argument]:
        return [
            Argument(names=("help", "h"), optional=True, help="this help, or a task's options: TASK --help"),
            Argument(names=("version", "V"), kind=bool, default=False, help="the tool's version"),
            Argument(names=("list", "l"), kind=bool, default=False, help="the tasks by family, as above"),
            Argument(names=("project",), help="the project directory (default: $SGLANG_DEPLOY_PROJECT, else the "
                                              "nearest directory upwards holding inventory/)"),
            Argument(names=("dry", "R"), kind=bool, default=False,
                     help="the task's --dry-run (deploy, tune); refused by a task without one"),
            Argument(names=("print-completion-script",), default="",
                     help="print the tab-completion script for this shell: bash, zsh or fish"),
            Argument(names=("complete",), kind=bool, default=False, help="print completions of the line so far"),
        ]

    def parse_core(self, argv: list[str] | None) -> None:
        from invoke.completion.complete import print_completion_script
        self.normalize_argv(argv)
        try:
            self.parse_core_args()
        except ParseError as error:
            raise self.usage_error(error) from None
        if self.args.version.value:
            self.print_version()
            raise Exit
        shell = self.args["print-completion-script"].value
        if shell:
            if shell not in COMPLETION_SHELLS:
                raise Exit(f"error: --print-completion-script: no completion script for {shell!r}; shells: "
                           f"{', '.join(COMPLETION_SHELLS)}{did_you_mean(shell, COMPLETION_SHELLS)}",
                           code=USAGE_ERROR)
            print_completion_script(shell=shell, names=self.binary_names)
            raise Exit
        given = self.args["project"].value
        if given:
            from deploy_lib.deploy.project import PROJECT_ENV
            os.environ[PROJECT_ENV] = given

    def parse_tasks(self) -> None:
        contexts = self._make_parser().contexts
        operands = {name: task.operand for name in self.collection.task_names
                    if (task := self.collection[name]) is not None and getattr(task, "operand", None)}
        try:
            self.core.unparsed[:] = with_operand(self.core.unparsed, contexts, self.initial_context, operands)
            check_line(self.core.unparsed, contexts, self.initial_context)
            super().parse_tasks()
        except ParseError as error:
            raise self.usage_error(error) from None

    def usage_error(self, error: ParseError) -> Exit:
        """invoke's parse errors (exit 1 there) as the tool's usage errors: `error: ...` naming where, exit 2."""
        task = error.context.name if error.context is not None and error.context.name else None
        where = f"`{self.binary} {task} --help` lists its options" if task else (
            f"`{self.binary} --help` lists the tasks")
        said = re.sub(r"<Argument: ([\w-]+)[^>]*>", r"--\1", str(error))  # invoke names a flag by its repr
        drift_check = "--" + DRIFT_CHECK.replace("_", "-") in self.argv
        return _refused(Exit(f"error: {said} ({where})", code=usage_code(drift_check)), error, list(self.argv))

    def update_config(self, merge: bool = True) -> None:
        """invoke's options for `c.run` (echo, pty, hide, warn, sudo, timeouts) are not the tool's: nothing to add."""
        if merge:
            self.config.merge()

    def parse_cleanup(self) -> None:
        from invoke.completion.complete import complete
        asked = self.args.help.value
        if asked is True:
            self.print_help()
            raise Exit
        if asked:
            if asked not in self.parser.contexts:
                raise Exit(f"error: no task named {asked!r}{did_you_mean(asked, list(self.parser.contexts))} "
                           f"(`{self.binary} --help` lists the tasks)", code=USAGE_ERROR)
            self.print_task_help(asked)
            raise Exit
        if self.args.list.value:
            self.print_lines(self.task_lines())
            raise Exit
        if self.args.complete.value:
            complete(names=self.binary_names, core=self.core, initial_context=self.initial_context,
                     collection=self.collection, parser=self._make_parser())
        if not self.tasks:
            self.no_tasks_given()

    def task_lines(self) -> list[str]:
        from deploy_cli.usage import task_list
        return task_list(self.collection)

    def print_help(self) -> None:
        from deploy_cli.usage import overview
        self.print_lines(overview(self.binary, self.version, self.collection, self.initial_context, HIDDEN_CORE))

    def print_task_help(self, name: str) -> None:
        from deploy_cli.usage import shown_name, task_help
        self.print_lines(task_help(self.binary, shown_name(self.collection, name), self.collection[name],
                                   self.parser.contexts[name]))

    @staticmethod
    def print_lines(lines: list[str]) -> None:
        print("\n".join(lines))


def main() -> None:
    from deploy_cli.collection import user_tasks
    from deploy_lib.program_name import set_program
    set_program(NAME)  # the messages name `sglang-deploy TASK`, the command the user ran
    program = DeployProgram(name=NAME, binary=NAME, version=version(NAME), namespace=user_tasks(),
                            executor_class=CheckedLineExecutor)
    try:
        try:
            program.run()
        finally:
            sys.stdout.flush()  # help is written at exit otherwise, past the try
    except BrokenPipeError:
        try:
            stdout_gone()
        except Exit as stopped:
            sys.exit(stopped.code)
