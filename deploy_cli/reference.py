"""The command reference, docs/reference.md, generated from the command line's own definitions (each task's
docstring, options and help text, by family) and the error classes' exit codes: never written by hand, and a test
fails when the committed page differs. `python -m deploy_cli.reference > docs/reference.md` writes it again."""

from __future__ import annotations

import inspect

from deploy_cli.collection import FAMILIES, user_tasks
from deploy_cli.usage import exit_code_rows, first_line, listed, option_rows

HEADER = """# Reference: every command and option

Generated from the tool's own definitions (`python -m deploy_cli.reference > docs/reference.md`); the same text
as `sglang-deploy TASK --help`. [commands.md](commands.md) says how the commands fit together.
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def reference_page() -> str:
    collection = user_tasks()
    contexts = {context.name: context for context in collection.to_contexts()}
    by_family: dict[str, list[str]] = {}
    for name, task in listed(collection):
        full = next(each for each, aliases in collection.task_names.items() if name in (each, *aliases))
        body = getattr(task, "body", task)
        doc = inspect.getdoc(task) or ""
        rest = [" ".join(paragraph.split()) for paragraph in doc.split("\n\n")[1:]]
        operand = getattr(task, "operand", None)
        lines = [f"### {name}", "", first_line(task), *(["", *rest] if rest else [])]
        if operand:
            lines += ["", f"A word after the task is its `--{operand}`: `sglang-deploy {name} NAME`."]
        rows = option_rows(contexts[full])
        lines += ["", "| option | what it does |", "| --- | --- |",
                  *(f"| `{_cell(spec)}` | {_cell(text)} |" for spec, text in rows)] if rows else ["", "No options."]
        by_family.setdefault(FAMILIES[body.__module__], []).append("\n".join(lines))
    sections = [f"## {family}\n\n" + "\n\n".join(by_family[family]) for family in FAMILIES.values()
                if family in by_family]
    codes = ["| code | what it means |", "| --- | --- |",
             *(f"| {code.strip()} | {_cell(meaning)} |" for code, meaning in exit_code_rows())]
    return "\n\n".join([HEADER.rstrip(), *sections, "## Exit codes\n\n" + "\n".join(codes) +
                        "\n\nWhat each one means for your host, and what to run next: "
                        "[troubleshooting.md](troubleshooting.md)."]) + "\n"


if __name__ == "__main__":
    print(reference_page(), end="")
