"""Operator mistakes, tried as a new user would type them: each is refused with exit 2 before anything runs, naming
the flag (or the file) as typed and what to give instead; none is guessed at, none ends in a traceback.

The table is the record: the command line as typed, and how the refusal starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli import invoke
from invoke.util import Lexicon

from deploy_cli.collection import user_tasks
from deploy_cli.program import NAME, DeployProgram, OneTaskExecutor, check_line

# (command line, the refusal's first words). Options that take a value, given without one: invoke let a repeatable
# one pass empty (`--serial --dry-run` deployed every host of the group in one batch).
NO_VALUE = [
    ("deploy --group gpu --serial --dry-run", "error: --serial needs a value (--serial=SERIAL): none was given "
                                              "before --dry-run; nothing was run"),
    ("deploy --group gpu --serial", "error: --serial needs a value (--serial=SERIAL): none was given at the end"),
    ("rollback --group gpu --serial --yes", "error: --serial needs a value (--serial=SERIAL): none was given before "
                                            "--yes"),
    ("bench --compare", "error: --compare needs a value (--compare=COMPARE): none was given at the end"),
    ("bench --compare 20260101-a --compare", "error: --compare needs a value"),
    ("render glm5-nvfp4 --set", "error: --set needs a value (--set=SET): none was given at the end"),
    ("plan glm5-nvfp4 --set --json", "error: --set needs a value (--set=SET): none was given before --json"),
    ("report --release", "error: --release needs a value (--release=RELEASE): none"),
    ("gpu-check --sizes", "error: --sizes needs a value (--sizes=SIZES): none"),
    ("tune --vary --dry-run", "error: --vary needs a value (--vary=VARY): none was given before --dry-run"),
    ("deploy --profile --yes", "error: --profile needs a value (--profile=PROFILE): none was given before --yes"),
    ("deploy -p -y", "error: -p needs a value (--profile=PROFILE): none was given before -y"),
    ("logs -n", "error: -n needs a value (--lines=LINES): none was given at the end"),
    ("status --host --json", "error: --host needs a value (--host=HOST): none was given before --json"),
    ("deploy --host --dryrun", "error: --host needs a value (--host=HOST): none was given before --dryrun"),
]
TWICE = [
    ("logs -n 5 -n 10", "error: -n is given twice ('5', then '10') and takes one value: give it once"),
    ("logs --lines=5 --lines 10", "error: --lines is given twice ('5', then '10')"),
    ("logs -n5 --lines=10", "error: --lines is given twice ('5', then '10')"),
    ("deploy --host a --host b", "error: --host is given twice ('a', then 'b')"),
    ("deploy -H a --host=b", "error: --host is given twice ('a', then 'b')"),
    ("render --sglang-version 0.5.9 --sglang-version 0.5.23", "error: --sglang-version is given twice"),
]
UNKNOWN = [
    ("deply", "error: no task named 'deply'; did you mean `deploy`? (`sglang-deploy --help` lists the tasks)"),
    ("stauts", "error: no task named 'stauts'; did you mean `status`?"),
    ("nosuch", "error: no task named 'nosuch' (`sglang-deploy --help` lists the tasks)"),
    ("render --profle glm5-nvfp4", "error: `render` has no option --profle; did you mean `--profile`? "
                                   "(`sglang-deploy render --help` lists its options)"),
    ("deploy --dryrun", "error: `deploy` has no option --dryrun; did you mean `--dry-run`?"),
    ("status --hots gpu1", "error: `status` has no option --hots; did you mean `--host`?"),
    ("logs --bogus", "error: `logs` has no option --bogus (`sglang-deploy logs --help` lists its options)"),
    ("render -yq", "error: `render` has no option -y"),
    ("status gpu1", "error: `status` takes no bare word: 'gpu1' is no option's value (a value goes after its "
                    "option: `--host NAME`)"),
    ("render glm5-nvfp4 glm5-nvfp4-fusion", "error: `render` takes no bare word: 'glm5-nvfp4-fusion'"),
]
ANSIBLE = [
    ("deploy --limit gpu1", "error: --limit is Ansible's, and `deploy` has no such option: a host is `--host NAME`, "
                            "a group `--group NAME`"),
    ("--limit gpu1 status", "error: --limit is Ansible's, and the program has no such option: a host is"),
    ("status -e x=1", "error: -e is Ansible's, and `status` has no such option: a profile value is overridden by "
                      "`--set path.to.key=value`"),
    ("deploy --extra-vars server.port=30001", "error: --extra-vars is Ansible's, and `deploy` has no such option: "
                                              "a profile value is overridden by `--set"),
    ("deploy --check", "error: --check is Ansible's, and `deploy` has no such option: what would change is "
                       "`--dry-run` (deploy, tune) or the `plan` task"),
    ("render -C", "error: -C is Ansible's, and `render` has no such option: what would change is `--dry-run`"),
]


@pytest.mark.parametrize(("line", "refusal"), NO_VALUE + TWICE + UNKNOWN + ANSIBLE)
def test_a_mistake_on_the_command_line_is_refused_naming_the_flag_as_typed(
        line: str, refusal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Through `sglang-deploy`'s own program, in a directory that is no project: a mistake taken as a command would
    fail later, on the missing inventory, with another message."""
    monkeypatch.chdir(tmp_path)
    program = DeployProgram(name=NAME, binary=NAME, version="0", namespace=user_tasks(),
                            executor_class=OneTaskExecutor)
    with pytest.raises(SystemExit) as ended:
        program.run([NAME, *line.split()])
    shown = capsys.readouterr()
    assert (ended.value.code, shown.out) == (2, "")
    assert shown.err.startswith(refusal), shown.err


@pytest.mark.parametrize(("line", "refusal"), [
    ("deploy --group gpu --serial --dry-run", "error: --serial needs a value (--serial=SERIAL): none was given "
                                              "before --dry-run; nothing was run"),
    ("bench --compare", "error: --compare needs a value (--compare=COMPARE): none was given at the end"),
    ("render -p glm5-nvfp4 --set", "error: --set needs a value (--set=SET): none was given at the end")])
def test_the_checkouts_invoke_refuses_a_repeatable_option_without_its_value_too(line: str, refusal: str,
                                                                                   tmp_path: Path) -> None:
    """invoke's own parser, which the checkout's `invoke` runs, accepts `--serial --dry-run` as no --serial at all:
    the task's executor refuses it before the task runs."""
    refused = invoke(*line.split(), cwd=tmp_path)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.startswith(refusal), refused.stderr


@pytest.mark.parametrize("line", [
    "deploy --serial 1 --serial 50% -p glm5", "logs -n5", "logs --lines=-1", "render -pglm5 --set a=b --set c=d",
    "deploy -yi inv.yaml", "status --host deploy", "patch --check --name fusion-sm120", "deploy --help",
    "bench --compare a --compare b", "render --json --profile x -- anything"])
def test_a_line_that_means_one_thing_is_not_refused(line: str) -> None:
    """Values that look like something else (a task's name, a negative number) stay values; a task's own flag of an
    Ansible name (`patch --check`) stays its own; what follows `--` is not read."""
    namespace = user_tasks()
    contexts = Lexicon({context.name: context for context in namespace.to_contexts()})
    for name, aliases in namespace.task_names.items():
        for alias in aliases:
            contexts.alias(alias, to=name)
    check_line(line.split(), contexts, DeployProgram(namespace=namespace).initial_context)
