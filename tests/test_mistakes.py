"""Operator mistakes, tried as a new user would type them: each is refused with exit 2 before anything runs, naming
the flag (or the file and where in it) as typed and what to give instead; none is guessed at, none ends in a
traceback.

The tables are the record: the command line as typed (and the files it reads), and how the refusal starts."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.cli import REPO, invoke, sglang_deploy
from invoke.util import Lexicon

from deploy_cli.collection import user_tasks
from deploy_cli.envelope import Envelope
from deploy_cli.program import DeployProgram, check_line
from deploy_lib.errors import ConfigError
from deploy_lib.yaml_io import read_text_file

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
    ("deploy --group -y", "error: --group needs a value (--group=GROUP): none was given before -y"),
    ("deploy --group gpu --max-fail --yes", "error: --max-fail needs a value (--max-fail=MAX_FAIL): none was given "
                                            "before --yes"),
    ("deploy -yp", "error: -p needs a value (--profile=PROFILE): none was given at the end"),
    ("render glm5-nvfp4 --sglang-version", "error: --sglang-version needs a value"),
    ("rollback --to --yes", "error: --to needs a value (--to=TO): none was given before --yes"),
    ("logs -H", "error: -H needs a value (--host=HOST): none was given at the end"),
    ("status -i", "error: -i needs a value (--inventory=INVENTORY): none was given at the end"),
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
    ("rollbak", "error: no task named 'rollbak'; did you mean `rollback`?"),
    ("--help rollbak", "error: no task named 'rollbak'; did you mean `rollback`? (`sglang-deploy --help` lists"),
    ("relases", "error: no task named 'relases'; did you mean `releases`?"),
    ("--projct . status", "error: the program has no option --projct; did you mean `--project`?"),
    ("deploy --grup gpu", "error: `deploy` has no option --grup; did you mean `--group`?"),
    ("logs --follw", "error: `logs` has no option --follw; did you mean `--follow`?"),
    ("deploy -yq", "error: `deploy` has no option -q"),
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
    ("render --limit gpu1", "error: `render` has no option --limit: --limit PATTERN (Ansible's host patterns) is an "
                            "option of the tasks that take both --host and --group (deploy, status, logs, ...), given "
                            "after the task"),
    ("--limit gpu1 status", "error: the program has no option --limit: --limit PATTERN (Ansible's host patterns)"),
    ("gpu-check --limit 'gpu*'", "error: `gpu-check` has no option --limit"),
    ("router.status --group gpu --limit gpu1", "error: `router.status` has no option --limit"),
    ("status --group gpu --limit", "error: --limit needs a value (--limit=LIMIT): none was given at the end"),
    ("status --limit a --limit b", "error: --limit is given twice ('a', then 'b')"),
    ("status -e x=1", "error: `status` has no option -e: Ansible's extra vars are a profile's values here: "
                      "`--set path.to.key=value` (deploy, plan, render)"),
    ("deploy --extra-vars server.port=30001", "error: `deploy` has no option --extra-vars: Ansible's extra vars are "
                                              "a profile's values here: `--set"),
    ("deploy --check", "error: `deploy` has no option --check: Ansible's check mode is `--dry-run` (deploy, tune) or "
                       "the `plan` task here"),
    ("render -C", "error: `render` has no option -C: Ansible's check mode is `--dry-run`"),
    ("deploy -K", "error: `deploy` has no option -K: Ansible's become password is the inventory's `become_password` "
                  "here: `ask` (typed once at the terminal) or `{env: VAR}`"),
    ("status --ask-become-pass", "error: `status` has no option --ask-become-pass: Ansible's become password is the "
                                 "inventory's `become_password` here"),
    # --set is a profile override wherever it is taken; patch's first spelling of the set's name is refused
    ("patch --set fusion-sm120 --check", "error: `patch` has no option --set: --set overrides a profile value "
                                         "(deploy, plan, render); a patch set is `--name NAME`"),
    ("status --set server.port=1", "error: `status` has no option --set: --set overrides a profile value"),
]



@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """tmp_path as the working directory, its own project (the project is found once per process: here, once per
    test, and not kept for the tests after it)."""
    monkeypatch.chdir(tmp_path)  # conftest's project_found_per_test clears the project found and its variables
    yield tmp_path

# A wrong value is named by the flag that gave it (`--search random` was reported as `--vary: search: ...`, `-n abc`
# as `--lines`).
VALUES = [
    ("logs -n abc", "error: -n/--lines takes a whole number (0 or more), got 'abc'"),
    ("logs --lines=-5", "error: -n/--lines takes a whole number (0 or more), got '-5'"),
    ("tune --vary features.cuda_graph=true,false --search random",
     "error: --search 'random': Input should be 'grid' or 'halving'"),
    ("tune --vary features.cuda_graph=true,false --keep x", "error: --keep 'x': Input should be 'winner' or 'none'"),
    ("tune --vary features.cuda_graph=true,false --keep winer",
     "error: --keep 'winer': Input should be 'winner' or 'none'; did you mean `winner`?"),
    ("tune --vary parallel.tp=1,2 --search random --keep x",
     "error: --keep 'x': Input should be 'winner' or 'none'\n--search 'random': Input should be 'grid' or 'halving'"),
    ("deploy --group gpu --serial 0 --dry-run", "error: --serial takes a whole number of hosts (>= 1) or a percentage "
                                                "(1%-100%), got '0'"),
    ("deploy --group gpu --serial 150% --dry-run", "error: --serial takes a whole number of hosts (>= 1) or a "
                                                   "percentage (1%-100%), got '150%'"),
    ("rollback --group gpu --max-fail -1 --yes", "error: --max-fail takes a whole number of hosts (>= 0) or a "
                                                 "percentage (0%-100%), got '-1'"),
    ("tune --vary nokey --dry-run", "error: --vary 'nokey': write KEY=V1,V2,..."),
    ("tune --vary parallel.tp= --dry-run", "error: --vary 'parallel.tp=': parallel.tp has an empty value"),
    ("tune --vary memory.max_running_requests=64,64 --dry-run",
     "error: --vary 'memory.max_running_requests=64,64': memory.max_running_requests: 64 listed twice"),
    ("tune --vary features.cuda_graph=true --vary features.cuda_graph=false --dry-run",
     "error: --vary 'features.cuda_graph=false': features.cuda_graph is varied twice"),
    ("tune -p x --vary a=1,2 --resume t1 --dry-run", "error: --resume continues the sweep as it was started: drop "
                                                     "--vary, --spec, --keep and --search"),
    ("tune --dry-run", "error: tune needs something to vary: --vary KEY=V1,V2,... or --spec tune/NAME.yaml"),
    ("tune --spec nosuch.yaml --dry-run", "error: nosuch.yaml: cannot read: no such file"),
    ("workload --name x --window abc", "error: --window 'abc': give a positive duration such as 90s, 10m or 1h"),
    ("workload --name x --every 0", "error: --every '0': give a positive duration"),
    # the name was "workload name '../x'" and the path "cannot write the schema to ...": no flag named
    ("workload --name ../x", "error: --name '../x': give a plain name such as `chat-peak`"),
    ("schema -o /nonexistent/dir/schema.json", "error: -o/--output /nonexistent/dir/schema.json: cannot write the "
                                               "schema there: No such file or directory"),
    ("init --model Qwen/Qwen3-8B --gpus 3 --host 192.0.2.1", "error: init --gpus 3: Input should be 1, 2, 4, 8 or 16"),
    ("init --model Qwen/Qwen3-8B --gpus 1 --host a;b", "error: init --host 'a;b': String should match pattern"),
    ("init --gpus 1", "error: init needs your model and your host: --model and --host"),
    # a shell invoke has no script for ended in invoke's own words, exit 1
    ("--print-completion-script=tcsh", "error: --print-completion-script: no completion script for 'tcsh'; shells: "
                                       "bash, zsh, fish"),
    ("--print-completion-script zhs", "error: --print-completion-script: no completion script for 'zhs'; shells: "
                                      "bash, zsh, fish; did you mean `zsh`?"),
    ("--project /nonexistent/project status", "error: project directory /nonexistent/project ($SGLANG_DEPLOY_PROJECT "
                                              "or --project) does not exist"),
    # a release id no release can have went to the host first (exit 5 where it was down), then named no flag
    ("rollback --to ../etc --yes", "error: --to: invalid release id '../etc'\nhint: a release id is letters, digits"),
    ("bench --compare a --compare b;c", "error: --compare: invalid release id 'b;c'"),
    ("report --release x.tmp", "error: --release: invalid release id 'x.tmp'"),
    ("bench --compare 20260101-a", "error: --compare takes two release ids or more: --compare A --compare B"),
    ("docs nosuch", "error: --page: no page 'nosuch' in the guide"),
    ("adopt -p x --pid abc", "error: adopt takes --pid PID (a process id) or --unit NAME (a systemd unit), one of "
                             "them"),
    ("adopt -p x --pid 1 --unit u", "error: adopt takes --pid PID (a process id) or --unit NAME"),
    ("patch --name fusion-sm120 --enable --disable", "error: give exactly one of --enable, --disable, --check, "
                                                     "--audit"),
    ("patch --name fusion-sm12 --check", "error: no patch set named 'fusion-sm12' under "),
]


def refused_as_typed(line: str, refusal: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`sglang-deploy LINE` exits 2 with `refusal` on stderr; with --json, that refusal is the one document too."""
    code, out, err = sglang_deploy(line, capsys)
    assert code == 2 and err.startswith(refusal), err
    if "--json" not in line.split():
        assert out == ""
        return
    document = Envelope.model_validate_json(out)
    assert (document.outcome, document.exit_code, document.hosts) == ("failed", 2, [])
    assert document.error is not None and document.error.type == "UsageError"
    assert err.startswith("error: " + document.error.message)


@pytest.mark.parametrize(("line", "refusal"), NO_VALUE + TWICE + UNKNOWN + ANSIBLE + VALUES)
def test_a_mistake_on_the_command_line_is_refused_naming_the_flag_as_typed(
        line: str, refusal: str, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through `sglang-deploy`'s own program, in a directory that is no project: a mistake taken as a command would
    fail later, on the missing inventory, with another message."""
    refused_as_typed(line, refusal, capsys)


PROFILE = REPO / "inventory" / "profiles" / "glm5-nvfp4.yaml"
INVENTORY = b"all:\n  hosts:\n    gpu1: {ansible_host: 127.0.0.1}\n"
LATIN1 = "café".encode("latin-1")
# (what is wrong, the files written (None: a FIFO), the command line ({P}: a good profile), the refusal ({tmp}: the
# working directory)); a project with a good inventory/hosts.yaml unless the case writes its own.
FILES = [
    ("a profile in Latin-1", {"p.yaml": b"service: {name: " + LATIN1 + b"}\n"}, "render -p {tmp}/p.yaml",
     "error: {tmp}/p.yaml:1: not UTF-8: byte 0xe9 at offset 19\nhint: save the file as UTF-8 (`iconv -f LATIN1"),
    ("a profile in UTF-16", {"p.yaml": "service: {name: x}\n".encode("utf-16")}, "render {tmp}/p.yaml",
     "error: {tmp}/p.yaml:1: not UTF-8: byte 0xff at offset 0 (the file is UTF-16)\nhint: save the file as UTF-8 "
     "(`iconv -f UTF-16"),
    ("a profile extended by a Latin-1 one", {"p.yaml": b"extends: base\n", "base.yaml": b"# " + LATIN1 + b"\n"},
     "render {tmp}/p.yaml", "error: {tmp}/base.yaml:1: not UTF-8: byte 0xe9 at offset 5"),
    ("a YAML inventory in Latin-1 (line 3)", {"inventory/hosts.yaml": b"all:\n  hosts:\n    " + LATIN1 + b": {}\n"},
     "render {P}", "error: {tmp}/inventory/hosts.yaml:3: not UTF-8: byte 0xe9 at offset 21"),
    ("an INI inventory in Latin-1", {"hosts.ini": b"[gpu]\ngpu1 ansible_host=" + LATIN1 + b"\n"},
     "render {P} -i hosts.ini", "error: {tmp}/hosts.ini:2: not UTF-8: byte 0xe9 at offset 27"),
    ("an INI inventory in UTF-16", {"hosts": "[gpu]\ngpu1\n".encode("utf-16")}, "render {P} -i hosts",
     "error: {tmp}/hosts:1: not UTF-8: byte 0xff at offset 0 (the file is UTF-16)"),
    ("group_vars in Latin-1", {"inventory/group_vars/all.yml": b"note: " + LATIN1 + b"\n"}, "render {P}",
     "error: {tmp}/inventory/group_vars/all.yml:1: not UTF-8: byte 0xe9 at offset 9"),
    ("host_vars in UTF-16", {"inventory/host_vars/gpu1.yaml": "note: x\n".encode("utf-16")}, "render {P}",
     "error: {tmp}/inventory/host_vars/gpu1.yaml:1: not UTF-8: byte 0xff at offset 0 (the file is UTF-16)"),
    ("a tune spec in Latin-1", {"spec.yaml": b"vary:\n  note: " + LATIN1 + b"\n"},
     "tune -p {P} --spec spec.yaml --dry-run", "error: spec.yaml:2: not UTF-8: byte 0xe9 at offset 17"),
    ("an ssh config in Latin-1", {"inventory/hosts.yaml": INVENTORY.replace(b"}", b", ssh_config_file: ssh_config}"),
                                  "inventory/ssh_config": b"Host gpu1\n  User " + LATIN1 + b"\n"},
     "render {P}", "error: {tmp}/inventory/ssh_config:2: not UTF-8: byte 0xe9 at offset 20"),
    ("a profile that is a directory", {"d.yaml/x": b""}, "render {tmp}/d.yaml",
     "error: {tmp}/d.yaml: cannot read: a directory"),
    ("a profile that is a FIFO", {"f.yaml": None}, "render {tmp}/f.yaml",
     "error: {tmp}/f.yaml: cannot read: not a regular file"),
    ("an inventory that is a FIFO", {"hosts.yaml": None}, "render {P} -i hosts.yaml",
     "error: {tmp}/hosts.yaml: cannot read: not a regular file"),
    ("an inventory directory without a hosts file", {"inv/group_vars/all.yml": b"{}\n"}, "render {P} -i inv",
     "error: {tmp}/inv: a directory without an inventory file (hosts.yaml, hosts.yml, hosts.json, hosts.ini, "
     "hosts)\nhint: give the inventory file itself with -i"),
    ("an inventory directory with two hosts files", {"inv/hosts.yaml": INVENTORY, "inv/hosts.ini": b"gpu1\n"},
     "render {P} -i inv", "error: {tmp}/inv: a directory with 2 inventory files (hosts.yaml, hosts.ini)"),
]


def write_files(root: Path, files: dict[str, bytes | None]) -> None:
    for name, content in {"inventory/hosts.yaml": INVENTORY, **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            os.mkfifo(path)
        else:
            path.write_bytes(content)


@pytest.mark.parametrize(("wrong", "files", "line", "refusal"), FILES, ids=[case[0] for case in FILES])
def test_a_file_the_tool_cannot_read_is_refused_naming_it_and_where(
        wrong: str, files: dict[str, bytes | None], line: str, refusal: str, workdir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Input tried: each file the tool reads, not UTF-8 (a UnicodeDecodeError traceback, exit 1), not a regular
    file, or a directory given where a file is."""
    write_files(workdir, files)
    code, out, err = sglang_deploy(line.format(P=PROFILE, tmp=workdir), capsys)
    assert (code, out) == (2, "")
    assert err.startswith(refusal.format(tmp=workdir)), err


def test_an_inventory_directory_is_its_hosts_file_with_its_group_vars(workdir: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Input tried: `-i inventory/` as Ansible takes it (exit 2: "is a directory"). Its hosts file is the inventory,
    and the directory's group_vars/ apply (a var of no meaning there is warned about, naming it)."""
    write_files(workdir, {"inventory/group_vars/all.yml": b"ansible_hots: x\n"})
    by_file = sglang_deploy(f"render {PROFILE} -i inventory/hosts.yaml", capsys)
    by_directory = sglang_deploy(f"render {PROFILE} -i inventory/", capsys)
    assert by_file[0] == 0, by_file[2]
    assert by_directory == by_file and "ansible_hots" in by_file[2]


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


GROUPED = b"all:\n  children:\n    gpu:\n      hosts:\n        gpu1: {ansible_host: 127.0.0.1}\n"
# (what is wrong, the files written, the command line ({P}: the reference profile, TP 8), the refusal ({tmp}: the
# working directory)): each names the file and key the wrong value is written in, and a hint with real numbers.
BLAME = [
    ("gpu_count 0 in the inventory", {"inventory/hosts.yaml": INVENTORY.replace(b"}", b", gpu_count: 0}")},
     "render {P}", "error: {tmp}/inventory/hosts.yaml: host gpu1: gpu_count: 0 declares a host without GPUs, and "
                   "{P} needs 8\nhint: set gpu_count to the host's GPUs"),
    ("gpu_count 0 in group_vars", {"inventory/hosts.yaml": GROUPED, "inventory/group_vars/gpu.yml": b"gpu_count: 0\n"},
     "render {P}", "error: {tmp}/inventory/group_vars/gpu.yml: host gpu1: gpu_count: 0 declares a host without GPUs"),
    ("tp 8 x dp 2 on 8 GPUs", {"inventory/hosts.yaml": INVENTORY.replace(b"}", b", gpu_count: 8}")},
     "render {P} --set parallel.dp=2",
     "error: {P}: parallel: tp 8 x dp 2 needs 16 GPUs per node, host gpu1 has 8 ({tmp}/inventory/hosts.yaml: host "
     "gpu1: gpu_count)\nhint: tp x dp x pp (per node) must be at most 8: use tp 4 x dp 2 or tp 8, or a host with 16 "
     "GPUs"),
    ("tp 4 x pp 3 on 8 GPUs", {"inventory/hosts.yaml": INVENTORY.replace(b"}", b", gpu_count: 8}")},
     "render {P} --set parallel.tp=4 --set parallel.pp=3",
     "error: {P}: parallel: tp 4 x pp 3 needs 12 GPUs per node, host gpu1 has 8 ({tmp}/inventory/hosts.yaml: host "
     "gpu1: gpu_count)\nhint: tp x dp x pp (per node) must be at most 8: use tp 2 x pp 3 or tp 4 x pp 2, or a host "
     "with 12 GPUs"),
    ("a host range without its end", {"inventory/hosts.yaml": b"all:\n  hosts:\n    gpu[1:]: {}\n"}, "render {P}",
     "error: {tmp}/inventory/hosts.yaml: all.hosts: 'gpu[1:]': the range has no end. write a range as [begin:end] or "
     "[begin:end:step], e.g. gpu[1:8]"),
    ("tp 8 on 4 GPUs from host_vars", {"inventory/host_vars/gpu1.yml": b"gpu_count: 4\n"}, "render {P}",
     "error: {P}: parallel: tp 8 needs 8 GPUs per node, host gpu1 has 4 ({tmp}/inventory/host_vars/gpu1.yml: host "
     "gpu1: gpu_count)\nhint: tp x dp x pp (per node) must be at most 4: use tp 4, or a host with 8 GPUs"),
]


@pytest.mark.parametrize(("wrong", "files", "line", "refusal"), BLAME, ids=[case[0] for case in BLAME])
def test_a_profile_that_does_not_fit_the_host_blames_the_file_that_is_wrong(
        wrong: str, files: dict[str, bytes | None], line: str, refusal: str, workdir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Input tried: `gpu_count: 0` in the inventory (blamed on the profile's parallel.tp, hint `use tp <= 0`), TP 8 x
    DP 2 and TP 4 x PP 3 on 8 GPUs (hint `use tp <= 8` though tp was 8), a count from host_vars/; a range without
    its end (the hint printed `[begin🔚step]`: rich read `:end:` as an emoji code)."""
    write_files(workdir, files)
    code, out, err = sglang_deploy(line.format(P=PROFILE, tmp=workdir), capsys)
    assert (code, out) == (2, "")
    assert err.startswith(refusal.format(P=PROFILE, tmp=workdir)), err


def test_a_typo_in_group_vars_is_warned_about_naming_that_file(workdir: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Input tried: `ansible_hots` in group_vars/gpu.yml (the warning named inventory/hosts.yaml)."""
    write_files(workdir, {"inventory/hosts.yaml": GROUPED, "inventory/group_vars/gpu.yml": b"ansible_hots: x\n",
                          "inventory/host_vars/gpu1.yml": b"gpu_cout: 8\n"})
    code, _, err = sglang_deploy(f"render {PROFILE}", capsys)
    assert code == 0, err
    assert f"{workdir}/inventory/group_vars/gpu.yml: host gpu1: ansible_hots is not a var" in err
    assert f"{workdir}/inventory/host_vars/gpu1.yml: host gpu1: gpu_cout is not a var" in err


def test_vars_files_of_no_host_or_group_are_warned_about_naming_the_file(workdir: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Input tried: host_vars/gpu-1.yml for host gpu1 and group_vars/gpus.yml for group gpu (Ansible reads them for
    nothing, and the GPU count in them was silently not applied)."""
    write_files(workdir, {"inventory/hosts.yaml": GROUPED, "inventory/host_vars/gpu-1.yml": b"gpu_count: 8\n",
                          "inventory/group_vars/gpus.yml": b"gpu_count: 8\n", "inventory/group_vars/all.yml": b"{}\n",
                          "inventory/host_vars/gpu1/main.yml": b"{}\n"})
    code, _, err = sglang_deploy(f"render {PROFILE}", capsys)
    assert code == 0, err
    inventory = workdir / "inventory"
    assert err.count("warning:") == 2, err
    assert (f"{inventory}/host_vars/gpu-1.yml: {inventory}/hosts.yaml has no host 'gpu-1', so these vars apply to no "
            "host; did you mean `gpu1`?") in err
    assert f"{inventory}/group_vars/gpus.yml: {inventory}/hosts.yaml has no group 'gpus'" in err


def test_a_file_that_cannot_be_opened_is_refused_naming_it_and_why(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: a profile without read permission for the user (as root, which reads every file, the refusal
    of the operating system is stood in for)."""
    profile = tmp_path / "p.yaml"
    profile.write_text("model: {path: m}\n")

    def refused(path: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(Path, "read_bytes", refused)
    with pytest.raises(ConfigError) as refusal:
        read_text_file(profile)
    assert (str(refusal.value), refusal.value.exit_code) == (f"{profile}: cannot read: Permission denied", 2)


def profile_file(text: str, name: str = "p") -> dict[str, bytes | None]:
    return {f"inventory/profiles/{name}.yaml": text.encode()}


def inventory_file(text: str, name: str = "inventory/hosts.yaml") -> dict[str, bytes | None]:
    return {name: text.encode()}


def patch_set(meta: str, targets: dict[str, bytes] | None = None) -> dict[str, bytes | None]:
    """The project's patch set `mine` (patches/mine/), with the bundled nsa-aliases' target as its `t` by default."""
    target = (REPO / "roles" / "nsa-aliases" / "targets" / "deprecated-aliases.yaml").read_bytes()
    files: dict[str, bytes | None] = {"patches/mine/meta.yaml": meta.encode()}
    chosen = {"t": target} if targets is None else targets
    files |= {f"patches/mine/targets/{name}.yaml": text for name, text in chosen.items()}
    return files


BUNDLED_AGAIN = {f"patches/nsa-aliases/{path.relative_to(REPO / 'roles' / 'nsa-aliases')}": path.read_bytes()
                 for path in (REPO / "roles" / "nsa-aliases").rglob("*") if path.is_file()}
META = "name: mine\ndescription: x\npackages: [sglang]\ntargets: [t]\n"
ONE = "all:\n  hosts:\n    gpu1: {{ansible_host: 127.0.0.1, {}}}\n"
PROFILE_P = "{tmp}/inventory/profiles/p.yaml"
# (what is wrong, the files written, the command line ({P}: the reference profile, p: inventory/profiles/p.yaml), the
# refusal ({tmp}: the working directory)): a project's files written wrong, each refused before any host is reached,
# naming the file (or the flag) and the key.
PROFILES = [
    ("a misspelt section", profile_file("model: {path: m}\nparalel: {tp: 1}\n"), "render p",
     f"error: {PROFILE_P}: paralel: unknown key; did you mean `parallel`?"),
    ("tp 3", profile_file("model: {path: m}\nparallel: {tp: 3}\n"), "render p",
     f"error: {PROFILE_P}: parallel.tp: Input should be 1, 2, 4, 8 or 16"),
    ("an extends cycle", profile_file("extends: q\nmodel: {path: m}\n") | profile_file("extends: p\n", "q"),
     "render p", f"error: {PROFILE_P}: extends: cycle p -> q -> p"),
    ("extends a missing profile", profile_file("extends: base\nmodel: {path: m}\n"), "render p",
     f"error: {PROFILE_P}: extends: profile 'base' not found"),
    ("an empty profile", profile_file(""), "render p", f"error: {PROFILE_P}: file is empty"),
    ("a list at the top", profile_file("- model\n"), "render p",
     f"error: {PROFILE_P}: top level must be a mapping of keys, got list"),
    ("a key twice", profile_file("model: {path: m}\nmodel: {path: n}\n"), "render p",
     "error: {tmp}/inventory/profiles/p.yaml:2:1: invalid YAML: duplicate key 'model' (first on line 1)"),
    ("an unclosed brace", profile_file("model: {path: m\nparallel: [\n"), "render p",
     "error: {tmp}/inventory/profiles/p.yaml:2:9: invalid YAML: expected ',' or '}}', but got ':'"),
    ("a port above 65535", profile_file("model: {path: m}\nserver: {port: 70000}\n"), "render p",
     f"error: {PROFILE_P}: server.port: Input should be less than or equal to 65535"),
    ("a memory fraction of 1.5", profile_file("model: {path: m}\nmemory: {mem_fraction_static: 1.5}\n"), "render p",
     f"error: {PROFILE_P}: memory.mem_fraction_static: Input should be less than 1"),
    ("no model", profile_file("parallel: {tp: 1}\n"), "render p", f"error: {PROFILE_P}: model: Field required"),
    ("an env value over two lines", profile_file('model: {path: m}\nenv: {A: "x\\ny"}\n'), "render p",
     f"error: {PROFILE_P}: env.A: contains the control character '\\n'"),
    ("a service name with a space", profile_file('model: {path: m}\nservice: {name: "a b"}\n'), "render p",
     f"error: {PROFILE_P}: service.name: String should match pattern"),
    ("a relative venv", profile_file("model: {path: m}\nservice: {venv: ml-env}\n"), "render p",
     f"error: {PROFILE_P}: service.venv: String should match pattern '^/'"),
    ("a secret with two sources", profile_file("model: {path: m}\nsecrets: {HF_TOKEN: {env: A, file: /x}}\n"),
     "render p", f"error: {PROFILE_P}: secrets.HF_TOKEN: give exactly one of `env: VAR_NAME`, `file: "
                 "/path/to/secret` or `command: "),
    ("a secret source misspelt", profile_file("model: {path: m}\nsecrets: {HF_TOKEN: {nev: A}}\n"), "render p",
     f"error: {PROFILE_P}: secrets.HF_TOKEN.nev: unknown key"),
    ("a secret command as one string", profile_file("model: {path: m}\nsecrets: {HF_TOKEN: {command: op read x}}\n"),
     "render p", f"error: {PROFILE_P}: secrets.HF_TOKEN.command: write the command as a list of words"),
    # a secret that cannot be read named no profile
    ("a secret from a variable not set", profile_file("model: {path: m}\nsecrets: {HF_TOKEN: {env: "
                                                       "SGLANG_DEPLOY_TEST_UNSET}}\n"), "deploy p -y",
     f"error: {PROFILE_P}: secret HF_TOKEN: environment variable SGLANG_DEPLOY_TEST_UNSET is not set on this "
     "machine"),
    ("a secret file that is a directory", profile_file("model: {path: m}\nsecrets: {HF_TOKEN: {file: inventory}}\n"),
     "deploy p -y", f"error: {PROFILE_P}: secret HF_TOKEN: inventory: cannot read: a directory"),
    ("--set of an unknown key", profile_file("model: {path: m}\n"), "render p --set nosuch=1",
     "error: profile p with --set nosuch=1: nosuch: unknown key"),
    ("--set without a value", profile_file("model: {path: m}\n"), "render p --set parallel.tp",
     "error: --set 'parallel.tp': not of the form path.to.key=value"),
    ("--set of a wrong value", profile_file("model: {path: m}\n"), "render p --set parallel.tp=abc",
     "error: profile p with --set parallel.tp=abc: parallel.tp: Input should be 1, 2, 4, 8 or 16"),
    # "SGLang version: ..." named no flag; plan against the host took --sglang-version and ignored it
    ("--sglang-version not a version", {}, "render {P} --sglang-version banana",
     "error: --sglang-version: 'banana' is not a version"),
    ("--sglang-version on a plan against the host", {}, "plan {P} --sglang-version 0.5.9",
     "error: --sglang-version is for --against renders"),
    # `-p NAME.yaml` was looked for in the working directory, the hint listing its (no) profiles
    ("a profile's file name given as its name", profile_file("model: {path: m}\n"), "render -p p.yaml",
     "error: profile 'p.yaml': no file {tmp}/p.yaml; did you mean `p`?"),
    ("a profile path not ending in .yaml", {"p.yml": b"model: {path: m}\n"}, "render ./p.yml",
     "error: profile './p.yml': a profile file ends in .yaml"),
    # a missing workload named no profile and key; a directory was "does not exist"
    ("a workload not recorded", profile_file("model: {path: m}\nbench: {workload: chat}\n"), "render p",
     f"error: {PROFILE_P}: bench.workload: workload file {{tmp}}/inventory/workloads/chat.yaml does not exist"),
    ("a workload that is a directory", profile_file("model: {path: m}\nbench: {workload: chat}\n")
     | {"inventory/workloads/chat.yaml/x": b""}, "render p",
     "error: {tmp}/inventory/workloads/chat.yaml: cannot read: a directory"),
    ("a workload file missing keys", profile_file("model: {path: m}\nbench: {workload: chat}\n")
     | {"inventory/workloads/chat.yaml": b"format: 1\nname: chat\n"}, "render p",
     "error: workload file {tmp}/inventory/workloads/chat.yaml: release: Field required"),
]
INVENTORIES = [
    # the host's `profile` var naming no profile was "profile 'nosuch' not found", no file or key named
    ("the profile var names no profile", inventory_file(ONE.format("profile: nosuch")), "render",
     "error: {tmp}/inventory/hosts.yaml: host gpu1: profile: no profile 'nosuch'"),
    ("the profile var in group_vars misspelt", inventory_file(GROUPED.decode()) | profile_file("model: {path: m}\n")
     | {"inventory/group_vars/gpu.yml": b"profile: q\n"}, "render",
     "error: {tmp}/inventory/group_vars/gpu.yml: host gpu1: profile: no profile 'q'"),
    ("the profile var not a profile name", inventory_file(ONE.format('profile: "a b"')), "render",
     "error: {tmp}/inventory/hosts.yaml: host gpu1: profile: profile name 'a b' is not valid"),
    ("an unclosed brace", inventory_file("all:\n  hosts:\n    gpu1: {ansible_host: 192.0.2.1\n"), "render {P}",
     "error: {tmp}/inventory/hosts.yaml:4:1: invalid YAML"),
    ("a top-level group other than all", inventory_file("gpu:\n  hosts:\n    gpu1: {}\n"), "render {P}",
     "error: {tmp}/inventory/hosts.yaml: top level must be `all:` only, found 'gpu'"),
    ("a port that is no number", inventory_file(ONE.format("ansible_port: 22x")), "render {P}",
     "error: {tmp}/inventory/hosts.yaml: host gpu1: ansible_port: Input should be a valid integer"),
    ("port 0", inventory_file(ONE.format("ansible_port: 0")), "render {P}",
     "error: {tmp}/inventory/hosts.yaml: host gpu1: ansible_port: Input should be greater than or equal to 1"),
    ("a negative gpu_count", inventory_file(ONE.format("gpu_count: -1")), "render {P}",
     "error: {tmp}/inventory/hosts.yaml: host gpu1: gpu_count: Input should be greater than or equal to 0"),
    ("a group that is its own child",
     inventory_file("all:\n  children:\n    a:\n      children:\n        b:\n          children:\n"
                    "            a: {}\n"), "render {P}",
     "error: {tmp}/inventory/hosts.yaml: group 'a' is its own child: a -> b -> a"),
    ("hosts as a list", inventory_file("all:\n  hosts:\n    - gpu1\n"), "render {P}",
     "error: {tmp}/inventory/hosts.yaml: all.hosts: must be a mapping of host name to vars"),
    ("no hosts", inventory_file("all:\n  hosts: {}\n"), "render {P}", "error: {tmp}/inventory/hosts.yaml: no hosts "
                                                                        "defined"),
    ("a login user with a space", inventory_file(ONE.format('ansible_user: "a b"')), "render {P}",
     "error: {tmp}/inventory/hosts.yaml: host gpu1: ansible_user: String should match pattern"),
    ("an address with a shell command", inventory_file(ONE.format('ansible_host: "h; rm -rf /"').replace(
        "ansible_host: 127.0.0.1, ", "")), "render {P}",
     "error: {tmp}/inventory/hosts.yaml: host gpu1: ansible_host: String should match pattern"),
    ("an unknown host", {}, "render {P} -H gpu2", "error: {tmp}/inventory/hosts.yaml: unknown host 'gpu2'"),
    # a host misspelt, or a host and a group swapped, had only the list of names
    ("a host misspelt", {}, "render {P} -H gpu-1",
     "error: {tmp}/inventory/hosts.yaml: unknown host 'gpu-1'; did you mean `gpu1`?"),
    ("a host given as --group", inventory_file(GROUPED.decode()), "status --group gpu1",
     "error: {tmp}/inventory/hosts.yaml: unknown group 'gpu1'; gpu1 is a host: --host gpu1"),
    ("a group given as --host", inventory_file(GROUPED.decode()), "logs --host gpu",
     "error: {tmp}/inventory/hosts.yaml: unknown host 'gpu'; gpu is a group: --group gpu"),
    ("an unknown group", inventory_file(GROUPED.decode()), "status --group gpus",
     "error: {tmp}/inventory/hosts.yaml: unknown group 'gpus'; did you mean `gpu`?"),
    ("group_vars that are a list", {"inventory/group_vars/all.yml": b"- a\n"}, "render {P}",
     "error: {tmp}/inventory/group_vars/all.yml: top level must be a mapping of keys, got list"),
    ("group_vars with a YAML error", {"inventory/group_vars/all.yml": b"a: [\n"}, "render {P}",
     "error: {tmp}/inventory/group_vars/all.yml:2:1: invalid YAML"),
    ("host_vars with a negative gpu_count", {"inventory/host_vars/gpu1.yml": b"gpu_count: -2\n"}, "render {P}",
     "error: {tmp}/inventory/host_vars/gpu1.yml: host gpu1: gpu_count: Input should be greater than or equal to 0"),
    # "invalid service name" named no flag
    ("a service name no unit can have", {}, "status -s a;b", "error: -s/--service: invalid service name 'a;b'"),
    ("a service name with .service", {}, "logs --service sglang.service",
     "error: -s/--service: invalid service name 'sglang.service'"),
    ("an INI child group without a section", {"hosts.ini": b"[gpu:children]\nnosuch\n"}, "render {P} -i hosts.ini",
     "error: {tmp}/hosts.ini:2: group 'nosuch' is a child but has no section of its own"),
    ("an INI host var without =", {"hosts.ini": b"[gpu]\ngpu1 ansible_host\n"}, "render {P} -i hosts.ini",
     "error: {tmp}/hosts.ini:2: host gpu1: 'ansible_host' is not a key=value host var"),
    ("an INI header not closed", {"hosts.ini": b"[gpu\ngpu1\n"}, "render {P} -i hosts.ini",
     "error: {tmp}/hosts.ini:1: '[gpu' is not a section header"),
    ("an INI section of an unknown type", {"hosts.ini": b"[gpu:foo]\ngpu1\n"}, "render {P} -i hosts.ini",
     "error: {tmp}/hosts.ini:1: section [gpu:foo] has an unknown type 'foo'"),
    ("an INI quote not closed", {"hosts.ini": b'[gpu]\ngpu1 ansible_host="192.0.2.1\n'}, "render {P} -i hosts.ini",
     "error: {tmp}/hosts.ini:2: cannot split 'gpu1 ansible_host=\"192.0.2.1': No closing quotation"),
    ("INI vars of a group with no section", {"hosts.ini": b"gpu1\n[gpu:vars]\ngpu_count=8\n"},
     "render {P} -i hosts.ini", "error: {tmp}/hosts.ini:2: [gpu:vars] is for a group that has no section of its own"),
    ("an INI vars line not key=value", {"hosts.ini": b"[gpu]\ngpu1\n[gpu:vars]\nnot a var\n"},
     "render {P} -i hosts.ini", "error: {tmp}/hosts.ini:4: [gpu:vars] expects key=value, got 'not a var'"),
    # a var given twice on one host line took the last one without a word
    ("an INI host var given twice", {"hosts.ini": b"[gpu]\ngpu1 ansible_port=22 ansible_port=2222\n"},
     "render {P} -i hosts.ini", "error: {tmp}/hosts.ini:2: host gpu1: ansible_port is given twice on the line"),
    ("an INI port given by host:port and by var", {"hosts.ini": b"[gpu]\ngpu1:2222 ansible_port=22\n"},
     "render {P} -i hosts.ini", "error: {tmp}/hosts.ini:2: host gpu1: ansible_port is given twice on the line"),
    ("an INI range backwards", {"hosts.ini": b"[gpu]\ngpu[3:1]\n"}, "render {P} -i hosts.ini",
     "error: {tmp}/hosts.ini:2: 'gpu[3:1]': the range's begin 3 is above its end 1"),
    ("an INI range of two widths", {"hosts.ini": b"[gpu]\ngpu[01:3]\n"}, "render {P} -i hosts.ini",
     "error: {tmp}/hosts.ini:2: 'gpu[01:3]': a zero-padded range needs begin and end of the same width"),
    ("gpu_count 0 in an INI inventory", {"hosts.ini": b"[gpu]\ngpu1 gpu_count=0\n"}, "render {P} -i hosts.ini",
     "error: {tmp}/hosts.ini: host gpu1: gpu_count: 0 declares a host without GPUs"),
    ("an INI profile var naming no profile", {"hosts.ini": b"[gpu]\ngpu1 profile=nosuch\n"}, "render -i hosts.ini",
     "error: {tmp}/hosts.ini: host gpu1: profile: no profile 'nosuch'"),
]
SPEC = "vary:\n  memory.max_running_requests: [64, 256]\n"
TUNE = "tune -p {P} --spec s.yaml --dry-run"
SPECS = [
    ("an objective not known", {"s.yaml": (SPEC + "objective: speed\n").encode()}, TUNE,
     "error: s.yaml: objective: Input should be 'throughput' or 'goodput'"),
    ("nothing under vary", {"s.yaml": b"vary: {}\n"}, TUNE, "error: s.yaml: vary: Dictionary should have at least 1 "
                                                            "item"),
    ("a misspelt key under vary", {"s.yaml": SPEC.replace("running", "runing").encode()}, TUNE,
     "error: s.yaml: vary.memory.max_runing_requests: memory.max_runing_requests: unknown key; did you mean "
     "`max_running_requests`?"),
    ("one value, not a list", {"s.yaml": b"vary:\n  memory.max_running_requests: 64\n"}, TUNE,
     "error: s.yaml: vary.memory.max_running_requests: Input should be a valid list"),
    ("a ladder from 0", {"s.yaml": (SPEC + "ladder: [0, 64]\n").encode()}, TUNE,
     "error: s.yaml: ladder.0: Input should be greater than or equal to 1"),
    ("a level not on the ladder", {"s.yaml": (SPEC + "level: 512\nladder: [1, 64]\n").encode()}, TUNE,
     "error: s.yaml: (top level): level 512 is not on the ladder [1, 64]"),
    ("an SLA key misspelt", {"s.yaml": (SPEC + "sla: {ttft: 5}\n").encode()}, TUNE,
     "error: s.yaml: sla.ttft: unknown key; did you mean `ttft_p99`?"),
    ("a patch set not known", {"s.yaml": b"vary:\n  patches: [none, nosuchpatch]\n"}, TUNE,
     "error: s.yaml: vary.patches: patches: 'nosuchpatch' is not a patch set"),
    ("a value twice", {"s.yaml": b"vary:\n  memory.max_running_requests: [64, 64]\n"}, TUNE,
     "error: s.yaml: vary: memory.max_running_requests: 64 listed twice"),
    ("vary misspelt", {"s.yaml": SPEC.replace("vary", "vry").encode()}, TUNE,
     "error: s.yaml: vary: Field required\ns.yaml: vry: unknown key; did you mean `vary`?"),
    ("keep not known", {"s.yaml": (SPEC + "keep: always\n").encode()}, TUNE,
     "error: s.yaml: keep: Input should be 'winner' or 'none'"),
    ("a workload not recorded, in a spec", {"s.yaml": (SPEC + "bench: {workload: nope}\n").encode()}, TUNE,
     "error: s.yaml: bench.workload: workload file {tmp}/inventory/workloads/nope.yaml does not exist"),
    ("a patch set misspelt by --vary", {}, "tune -p {P} --vary patches=none,fusion-sm12 --dry-run",
     "error: --vary patches=none,fusion-sm12: patches: 'fusion-sm12' is not a patch set; did you mean "
     "`fusion-sm120`?"),
    # the refusal showed the values as read (`true,maybe`), not as typed
    ("a value of no boolean by --vary", {}, "tune -p {P} --vary features.cuda_graph=yes,maybe --dry-run",
     "error: --vary features.cuda_graph=yes,maybe: features.cuda_graph: Input should be a valid boolean"),
    ("a key of no profile by --vary", {}, "tune -p {P} --vary nosuch.key=1,2 --dry-run",
     "error: --vary nosuch.key=1,2: nosuch: unknown key"),
    ("a key in the spec and by --vary", {"s.yaml": SPEC.encode()},
     "tune -p {P} --spec s.yaml --vary memory.max_running_requests=1,2 --dry-run",
     "error: --vary memory.max_running_requests=...: memory.max_running_requests is also varied in s.yaml"),
]
PATCH_SETS = [
    ("a folder without meta.yaml", {"patches/mine/README": b"x\n"}, "patches.list",
     "error: {tmp}/patches/mine: a folder of the project's patch sets without a meta.yaml"),
    ("a meta.yaml missing keys", patch_set("name: mine\n"), "patches.list",
     "error: {tmp}/patches/mine/meta.yaml: description: Field required"),
    # an unknown key in a patch set's files had no "did you mean"
    ("a misspelt key in meta.yaml", patch_set(META.replace("name:", "nam:")), "patch --name mine --check",
     "error: {tmp}/patches/mine/meta.yaml: name: Field required\n{tmp}/patches/mine/meta.yaml: nam: unknown key; "
     "did you mean `name`?"),
    ("a target with no file", patch_set(META, {}), "patches.list",
     "error: {tmp}/patches/mine/meta.yaml: targets: 't' has no file {tmp}/patches/mine/targets/t.yaml"),
    # a folder `mine` holding `name: other` was listed as other, and `patch --name mine` found nothing
    ("a name other than its folder's", patch_set(META.replace("name: mine", "name: other")), "patches.list",
     "error: {tmp}/patches/mine/meta.yaml: name: 'other' is not its folder's name 'mine'"),
    ("a package listed twice", patch_set(META.replace("[sglang]", "[sglang, sglang]")), "patches.list",
     "error: {tmp}/patches/mine/meta.yaml: packages: listed twice: sglang"),
    ("a target of another package", patch_set(META.replace("[sglang]", "[flashinfer]")), "patches.list",
     "error: {tmp}/patches/mine/targets/t.yaml: package: 'sglang' is not one of the packages in "),
    ("a target with a YAML error", patch_set(META, {"t": b"x: [\n"}), "patches.list",
     "error: {tmp}/patches/mine/targets/t.yaml:2:1: invalid YAML"),
    ("a feature that is not one", patch_set(META + "enables_feature: cuda_grph\n"), "patches.list",
     "error: {tmp}/patches/mine/meta.yaml: enables_feature: 'cuda_grph' is not a profile feature"),
    ("the name of a bundled set", BUNDLED_AGAIN, "patches.list",
     "error: two patch sets are named 'nsa-aliases': bundled "),
]


@pytest.mark.parametrize(("wrong", "files", "line", "refusal"), PROFILES + INVENTORIES + SPECS + PATCH_SETS,
                         ids=[case[0] for case in PROFILES + INVENTORIES + SPECS + PATCH_SETS])
def test_a_project_file_written_wrong_is_refused_naming_the_file_and_key(
        wrong: str, files: dict[str, bytes | None], line: str, refusal: str, workdir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Input tried: profiles, inventories (YAML, INI, group_vars/, host_vars/), tune specs, workload files and the
    project's patch sets, each written wrong as a user does, with the options that read them: exit 2 before any
    host is reached."""
    write_files(workdir, files)
    code, out, err = sglang_deploy(line.format(P=PROFILE, tmp=workdir), capsys)
    assert (code, out) == (2, ""), err
    assert err.startswith(refusal.format(P=PROFILE, tmp=workdir)), err


AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HF = "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"
MOVE = "and a credential is never written in a profile; move it to `secrets: {{name}: {env: {name}}}`"
# (what is wrong, the profile's env (or a --set), the line ({p}: the profile written), the secret, the refusal):
# secrets by value. `env: {AWS_SECRET_ACCESS_KEY: wJalr...}` was refused by its name, `HF_AUTH: hf_...` rendered with
# exit 0 and printed in clear under "environment file (secrets redacted)" and in --json's `environment`.
SECRETS = [
    ("an AWS secret key under a plain name", f"S3_KEY: {AWS_SECRET}", "render -p {p}", AWS_SECRET,
     "error: {p}: (top level): env.S3_KEY: its value looks like an AWS secret access key, "
     + MOVE.replace("{name}", "S3_KEY")),
    ("an AWS access key id", "S3_ID: AKIAIOSFODNN7EXAMPLE", "render -p {p} --json", "AKIAIOSFODNN7EXAMPLE",
     "error: {p}: (top level): env.S3_ID: its value looks like an AWS access key id"),
    ("a Hugging Face token", f"HF_AUTH: {HF}", "render -p {p}", HF,
     "error: {p}: (top level): env.HF_AUTH: its value looks like a Hugging Face token"),
    ("a GitHub token", "GH: ghp_16C7e42F292c6912E7710c838347Ae178B4a", "plan -p {p}",
     "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
     "error: {p}: (top level): env.GH: its value looks like a GitHub token"),
    ("an OpenAI key", "UPSTREAM: sk-proj-Xk3vN9qL2mP8rT5wY7zB1cD4fG6hJ0kA", "render -p {p} --json",
     "sk-proj-Xk3vN9qL2mP8rT5wY7zB1cD4fG6hJ0kA",
     "error: {p}: (top level): env.UPSTREAM: its value looks like an OpenAI-style API key"),
    ("a Slack token", "NOTIFY: xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "render -p {p}",
     "xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
     "error: {p}: (top level): env.NOTIFY: its value looks like a Slack token"),
    ("a JWT", "AUTH: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
     "render -p {p}", "dozjgNryP4J3jVmNHl0w5N", "error: {p}: (top level): env.AUTH: its value looks like a JSON Web "
                                                   "Token"),
    ("a PEM private key over lines", 'TLS: "-----BEGIN EC PRIVATE KEY-----\\nMHcCAQEEIBkg\\n-----END EC PRIVATE '
                                     'KEY-----"', "render -p {p}", "MHcCAQEEIBkg",
     "error: {p}: env: TLS: its value looks like a PEM private key, " + MOVE.replace("{name}", "TLS")),
    ("a long random string", "SESSION_SALT: Zx8Qp2Lm7Vn4Rt6Yw1Ks9Bd3Hf5Jg0Ca8Ue2Io4Pa6", "render -p {p}",
     "Zx8Qp2Lm7Vn4Rt6Yw1Ks9Bd3Hf5Jg0Ca8Ue2Io4Pa6",
     "error: {p}: (top level): env.SESSION_SALT: its value looks like a long random string (42 characters)"),
    ("a URL with a password", "MODEL_REPO: https://deploy:s3cr3tpass@git.example.com/m.git", "render -p {p}",
     "s3cr3tpass", "error: {p}: (top level): env.MODEL_REPO: its value looks like a URL with a password"),
    ("a Hugging Face token by --set", "OMP_NUM_THREADS: 8", f"render -p {{p}} --set env.HF_AUTH={HF} --json", HF,
     "error: profile p with --set env.HF_AUTH=<not shown: it looks like a credential>: (top level): env.HF_AUTH: "
     "its value looks like a Hugging Face token"),
    ("an AWS session key id", "S3_SESSION_ID: ASIAY34FZKBOKMUTVV7A", "render -p {p}", "ASIAY34FZKBOKMUTVV7A",
     "error: {p}: (top level): env.S3_SESSION_ID: its value looks like an AWS access key id"),
    ("a bearer header", f"AUTH_HEADER: Bearer {HF}", "render -p {p} --json", HF,
     "error: {p}: (top level): env.AUTH_HEADER: its value looks like a Hugging Face token"),
    ("a GitHub fine-grained token", "GIT_AUTH: github_pat_11ABCDEFG0abcdefghijkl_mnopqrstuvwxyz0123456789ABCDEFGHIJKL",
     "render -p {p}", "github_pat_11ABCDEFG0", "error: {p}: (top level): env.GIT_AUTH: its value looks like a GitHub "
                                               "token"),
    ("a Slack webhook", "ALERTS: https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
     "render -p {p}", "XXXXXXXXXXXXXXXXXXXXXXXX", "error: {p}: (top level): env.ALERTS: its value looks like a Slack "
                                                   "webhook URL"),
    ("an Anthropic-style key", "UPSTREAM_AUTH: sk-ant-api03-Xk3vN9qL2mP8rT5wY7zB1cD4fG6hJ0kAabc", "render -p {p}",
     "Xk3vN9qL2mP8rT5wY7zB1cD4fG6hJ0kAabc",
     "error: {p}: (top level): env.UPSTREAM_AUTH: its value looks like an OpenAI-style API key"),
    ("a random hex key", "SIGNING: 4f9d2c7e1a8b3f6d0c5e9a2b7f4d1c8e3a6b9f0d", "plan -p {p} --json",
     "4f9d2c7e1a8b3f6d0c5e9a2b7f4d1c8e3a6b9f0d",
     "error: {p}: (top level): env.SIGNING: its value looks like a long random hex string (40 characters)"),
    ("not_secret for a name that is a secret", f"HF_TOKEN: {HF}\nnot_secret: [HF_TOKEN]", "render -p {p}", HF,
     "error: {p}: (top level): env.HF_TOKEN looks like a secret; move it to `secrets: {HF_TOKEN: {env: HF_TOKEN}}`"),
    ("not_secret for a value that is no credential", "OMP_NUM_THREADS: 8\nnot_secret: [OMP_NUM_THREADS]",
     "render -p {p}", "\0", "error: {p}: (top level): not_secret: env.OMP_NUM_THREADS does not look like a "
                            "credential; remove it from not_secret"),
]


@pytest.mark.parametrize(("wrong", "env", "line", "secret", "refusal"), SECRETS, ids=[case[0] for case in SECRETS])
def test_an_env_value_that_looks_like_a_credential_is_refused_and_never_shown(
        wrong: str, env: str, line: str, secret: str, refusal: str, workdir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    first, _, rest = env.partition("\n")
    write_files(workdir, {"p.yaml": f"model: {{path: m}}\nenv:\n  {first}\n{rest}\n".encode()})
    path = workdir / "p.yaml"
    code, out, err = sglang_deploy(line.format(p=path), capsys)
    assert code == 2
    assert secret not in out + err
    assert (out if "--json" in line else err).lstrip("{\n ").startswith(
        refusal.replace("{p}", str(path)) if "--json" not in line else '"command"'), out + err
    assert refusal.replace("{p}", str(path)).removeprefix("error: ") in (out + err).replace('\\"', '"'), out + err


def test_a_value_said_not_to_be_a_secret_is_rendered(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The way out for a false positive: a commit id is long random hex, and `not_secret` says it is not a secret."""
    commit = "4f9d2c7e1a8b3f6d0c5e9a2b7f4d1c8e3a6b9f0d"
    write_files(workdir, {"p.yaml": f"model: {{path: m}}\nenv: {{BUILD_COMMIT: {commit}}}\n".encode()})
    refused = sglang_deploy(f"render -p {workdir}/p.yaml", capsys)
    assert refused[0] == 2 and "long random hex string (40 characters)" in refused[2]
    (workdir / "p.yaml").write_text(
        f"model: {{path: m}}\nenv: {{BUILD_COMMIT: {commit}}}\nnot_secret: [BUILD_COMMIT]\n")
    code, out, err = sglang_deploy(f"render -p {workdir}/p.yaml", capsys)
    assert code == 0, err
    assert f'BUILD_COMMIT="{commit}"' in out


GROUP_OF_THREE = (b"all:\n  children:\n    gpu:\n      hosts:\n        gpu1: {ansible_host: 192.0.2.1}\n"
                  b"        gpu2: {ansible_host: 192.0.2.2}\n        gpu3: {ansible_host: 192.0.2.3}\n"
                  b"    edge:\n      hosts:\n        router1: {ansible_host: 192.0.2.9}\n")
# --limit PATTERN as Ansible's habits type it, wrong: each refused naming the pattern before any host is reached.
LIMITS = [
    ("status --group gpu --limit gpu9", "error: --limit gpu9: 'gpu9' matches no host or group of the inventory"),
    ("deploy --group gpu --limit gpu1,gpu9 --dry-run", "error: --limit gpu1,gpu9: 'gpu9' matches no host or group"),
    ("stop --group gpu --limit gpu:!gpu0 --yes", "error: --limit gpu:!gpu0: 'gpu0' matches no host or group"),
    ("logs --group gpu --limit web[1:3]", "error: --limit web[1:3]: 'web' matches no host or group of the inventory"
                                          "\nhint: a subscript picks hosts of a group by position, as in Ansible: "
                                          "`web[0:1]` is the first two hosts of group web"),
    ("releases --group gpu --limit gpu[3]", "error: --limit gpu[3]: gpu[3]: gpu has 3 host(s): no position 3"),
    ("status --group gpu --limit edge", "error: --limit edge leaves no host of group gpu (gpu1, gpu2, gpu3)"),
    ("status --limit gpu:&edge", "error: --limit gpu:&edge: the pattern leaves no host"),
    ("restart --host gpu1 --limit gpu2 --yes", "error: --limit gpu2 does not name host gpu1 (--host): nothing to act "
                                               "on"),
    ("report --limit @retry", "error: --limit @retry: a file of hosts (@FILE, Ansible's retry file) is not read here"),
    ("uninstall --group gpu --limit ~gpu( --yes", "error: --limit: '~gpu(' is not a regular expression"),
    ("rollback --group gpu --limit gpu,,gpu1 --yes", "error: --limit gpu,,gpu1: an empty term"),
    ("status --group gpu --limit gpu[0", "error: --limit gpu[0: 'gpu[0' matches no host or group of the inventory"),
    ("start --group gpu --limit !gpu --yes", "error: --limit !gpu leaves no host of group gpu (gpu1, gpu2, gpu3)"),
    ("deploy --group gpu --limit &edge --dry-run", "error: --limit &edge leaves no host of group gpu"),
    ("restart --group gpu --limit gpu[-4] --yes", "error: --limit gpu[-4]: gpu[-4]: gpu has 3 host(s): no position -4"),
    # a task's one-host path (logs --follow, plan --against, tune without --group) is narrowed too: it was ignored
    ("logs --follow --host gpu1 --limit gpu2", "error: --limit gpu2 does not name host gpu1 (--host): nothing to act "
                                               "on"),
    ("logs --follow --limit gpu", "error: --limit gpu names 3 hosts (gpu1, gpu2, gpu3), and this acts on one host"),
    ("plan -p glm5-nvfp4 --against glm5-nvfp4 --limit gpu:!gpu1", "error: --limit gpu:!gpu1 names 2 hosts (gpu2, "
                                                                  "gpu3), and this acts on one host"),
]


@pytest.mark.parametrize(("line", "refusal"), LIMITS)
def test_a_limit_that_names_nothing_is_refused_before_any_host_is_reached(
        line: str, refusal: str, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_files(workdir, {"inventory/hosts.yaml": GROUP_OF_THREE})
    refused_as_typed(line, refusal, capsys)
