"""The reference, docs/reference.md, generated from the code: every task and option from the command line's own
definitions (each task's docstring, options and help text, by family), the one shape of every --json from its model
(deploy_cli/envelope.py), every profile key from the profile's JSON
Schema (its type, default and description) and every exit code from the error classes. Never written by hand: a test
fails when the committed page differs. `python -m deploy_cli.reference > docs/reference.md` writes it again."""

from __future__ import annotations

import inspect
import json
from typing import Any

from deploy_cli.collection import FAMILIES, user_tasks
from deploy_cli.usage import exit_code_rows, first_line, listed, option_rows

HEADER = """# Reference: every command, profile key and exit code

Generated from the tool's own definitions (`python -m deploy_cli.reference > docs/reference.md`). The commands
read as `sglang-deploy TASK --help` does; [commands.md](commands.md) says how they fit together. The
[profile keys](#profile-keys) read as `sglang-deploy schema` prints them; [profiles.md](profiles.md) shows profiles
to start from.
"""

PROFILE_KEYS = """## Profile keys

Every key a profile may have, from the profile's JSON Schema. A key left out takes its default; a dotted key is
written nested (`parallel.tp` is `parallel: {tp: 2}`). A choice's values are the union of what the SGLang
versions the tool knows accept; preflight checks them against the version installed on the host."""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A property's own schema, its `$ref` followed, and whether it may be null (`anyOf: [X, null]`)."""
    optional = False
    if "anyOf" in node:
        kinds = [each for each in node["anyOf"] if each.get("type") != "null"]
        optional = len(kinds) < len(node["anyOf"])
        node = {**kinds[0], **{k: v for k, v in node.items() if k != "anyOf"}} if len(kinds) == 1 else node
    if "$ref" in node:
        target = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node, optional


def _bounds(node: dict[str, Any]) -> str:
    """` 1 to 64`, ` in (0, 1)`, ` in (0, 10]`, ` >= 1`: the range a number must be in."""
    low, high = node.get("minimum", node.get("exclusiveMinimum")), node.get("maximum", node.get("exclusiveMaximum"))
    if low is None or high is None:
        return f" >= {low}" if low is not None else f" <= {high}" if high is not None else ""
    if "minimum" in node and "maximum" in node:
        return f" {low} to {high}"
    return f" in {'[' if 'minimum' in node else '('}{low}, {high}{']' if 'maximum' in node else ')'}"


def _type(schema: dict[str, Any], node: dict[str, Any]) -> str:
    node, _ = _resolve(schema, node)
    if "enum" in node:
        return "one of " + ", ".join(str(value) for value in node["enum"])
    if "const" in node:
        return f"only {node['const']}"
    kind = node.get("type")
    if kind == "array":
        return "list of " + _type(schema, node.get("items", {})).replace("one of", "each one of")
    if kind == "object" and "patternProperties" in node:
        return "mapping of NAME to " + _type(schema, next(iter(node["patternProperties"].values())))
    if kind == "object" and node.get("title") == "SecretRef":
        return "secret reference"
    if kind == "object":
        return "section"
    if kind in ("integer", "number"):
        return kind + _bounds(node)
    if kind == "string":
        return "absolute path" if node.get("pattern") == "^/" else "text"
    if kind == "boolean":
        return "true or false"
    raise ValueError(f"no reading for the schema node {node}")


def _default(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(str(each) for each in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def profile_key_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every profile key, in the schema's order. A section is listed by its
    keys; a section that may be absent (`gate`) is listed itself too, before them. A default the schema leaves out (a
    list or a mapping made fresh for each profile) is the model's; `required` when the key must be given."""
    from deploy_lib.profile import Profile, profile_json_schema
    schema = profile_json_schema()
    made = Profile.model_validate({"model": {"path": "owner/name"}}).model_dump(mode="json")
    rows: list[tuple[str, str, str, str]] = []

    def walk(properties: dict[str, Any], required: list[str], prefix: str, defaults: dict[str, Any] | None) -> None:
        for name, raw in properties.items():
            if name == "$schema":  # for editors, ignored by the tool (profiles.md's Editors)
                continue
            key = prefix + name
            node, optional = _resolve(schema, raw)
            section = "properties" in node and node.get("title") != "SecretRef"
            if "description" not in node and (optional or not section):
                raise ValueError(f"profile key {key} has no description: give its Field one")
            if section:
                if optional:
                    rows.append((key, "section", "", node["description"]))
                walk(node["properties"], node.get("required", []), key + ".", defaults.get(name) if defaults else None)
                continue
            if name in required:
                default = "required"
            elif "default" in node:
                default = _default(node["default"])
            elif defaults is not None and name in defaults:
                default = _default(defaults[name])
            else:
                default = ""
            rows.append((key, _type(schema, raw), default, node["description"]))

    first = {"extends": schema["properties"]["extends"]}  # the schema adds it last; a profile starts with it
    walk(first | schema["properties"], schema.get("required", []), "", made)
    return rows


def profile_keys_section() -> str:
    table = ["| key | type | default | description |", "| --- | --- | --- | --- |",
             *(f"| `{key}` | {_cell(kind)} | {_cell(default)} | {_cell(text)} |"
               for key, kind, default, text in profile_key_rows())]
    return PROFILE_KEYS + "\n\n" + "\n".join(table)


JSON_OUTPUT = """## JSON output

Every command that takes `--json` prints one JSON document on stdout, of the one shape below (schema version
{version}), for one host and for a group alike, when it succeeds and when it fails; progress, warnings and the
error's text go to stderr. Each host's `result` is what the command reports for that host: a deploy's or
rollback's outcome, a status report, the list of releases, a benchmark. `jq '.hosts[0].result'` reads one host's;
[upgrading.md](upgrading.md) says what changed from the shapes before it."""


def _json_type(node: dict[str, Any]) -> str:
    """A field's type in the envelope's JSON Schema, in words."""
    if "anyOf" in node:
        return " or ".join(_json_type(each) for each in node["anyOf"])
    if "$ref" in node:
        return node["$ref"].rsplit("/", 1)[1]
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return " or ".join(json.dumps(value) for value in node["enum"])
    kind = node.get("type")
    if kind == "array":
        return f"list of {_json_type(node.get('items', {}))}"
    if kind == "object":
        return f"mapping of text to {_json_type(node['additionalProperties'])}" \
            if isinstance(node.get("additionalProperties"), dict) else "object"
    return {"string": "text", "integer": "integer", "null": "null", "boolean": "true or false"}.get(kind or "",
                                                                                                 "any JSON")


def json_output_section() -> str:
    """The envelope of every --json (deploy_cli/envelope.py), a table per object, from its JSON Schema."""
    from deploy_cli.envelope import SCHEMA_VERSION, envelope_json_schema
    schema = envelope_json_schema()
    titles = {"Envelope": "The document", "HostDoc": "HostDoc: a host's result", "ErrorDoc": "ErrorDoc: an error",
              "RolloutDoc": "RolloutDoc: a group's rollout"}
    objects = [("Envelope", schema), *((name, schema["$defs"][name]) for name in ("HostDoc", "ErrorDoc", "RolloutDoc"))]
    parts = [JSON_OUTPUT.replace("{version}", str(SCHEMA_VERSION))]
    for name, node in objects:
        rows = [f"| `{key}` | {_cell(_json_type(field))} | {_cell(field['description'])} |"
                for key, field in node["properties"].items()]
        parts.append(f"### {titles[name]}\n\n{_cell(node['description'])}\n\n| key | type | what it holds |\n"
                     "| --- | --- | --- |\n" + "\n".join(rows))
    return "\n\n".join(parts)


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
    return "\n\n".join([HEADER.rstrip(), *sections, json_output_section(), profile_keys_section(),
                        "## Exit codes\n\n" + "\n".join(codes) +
                        "\n\nWhat each one means for your host, and what to run next: "
                        "[troubleshooting.md](troubleshooting.md)."]) + "\n"


if __name__ == "__main__":
    print(reference_page(), end="")
