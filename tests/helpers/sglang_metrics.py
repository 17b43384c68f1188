"""Facts about SGLang's metrics read from a release's own source (its wheel, unpacked by helpers.wheelcache): for each
metric deploy_lib.metrics.names reads, the file and line of its `name="sglang:..."`, its kind, the labels it adds to
its collector's, the default bucket bounds and the flag it needs; the labels of each collector and the bucket rules.

tests/data/metrics/sglang_metrics.yaml is this module's output for 0.5.9 and 0.5.23. To write it again:

    .venv/bin/python -m tests.helpers.sglang_metrics > tests/data/metrics/sglang_metrics.yaml
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from deploy_lib.metrics.names import Metric

VERSIONS = ("0.5.9", "0.5.23")
COLLECTOR_FILES = ("sglang/srt/observability/metrics_collector.py", "sglang/srt/metrics/collector.py")
UTILS_FILES = ("sglang/srt/observability/utils.py", "sglang/srt/metrics/utils.py")
# where each release builds the labels of a collector: a dict literal with these keys
SCHEDULER_LABEL_FILES = ("sglang/srt/observability/metrics_collector.py",
                         "sglang/srt/managers/scheduler_metrics_mixin.py")
TOKENIZER_LABEL_FILES = ("sglang/srt/observability/metrics_collector.py", "sglang/srt/managers/tokenizer_manager.py")


def _first(root: Path, candidates: tuple[str, ...], needle: str) -> tuple[str, str]:
    for relative in candidates:
        path = root / relative
        if path.is_file() and needle in (text := path.read_text()):
            return relative, text
    raise FileNotFoundError(f"none of {candidates} under {root} holds {needle!r}")


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _numbers(node: ast.AST) -> list[float]:
    return [float(n.value) for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, int | float) and not isinstance(n.value, bool)]


def _assigned_lists(function: ast.AST) -> dict[str, list[float]]:
    """name -> the numbers of a list literal assigned to it anywhere in the function."""
    found = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = _numbers(node.value)
    return found


def _buckets(call: ast.Call, lists: dict[str, list[float]]) -> list[float] | None:
    for keyword in call.keywords:
        if keyword.arg == "buckets":
            value = keyword.value
            if isinstance(value, ast.Call):  # generate_buckets(<rule>, <defaults>)
                value = value.args[1]
            if isinstance(value, ast.Name):
                return sorted(set(lists[value.id]))
            return sorted(set(_numbers(value)))
    return None


def _guards(tree: ast.Module) -> dict[int, str]:
    """line -> the name an enclosing `if <name>:` tests (0.5.9's `if collect_tokens_histogram:`)."""
    guarded = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name):
            for inner in node.body:
                for child in ast.walk(inner):
                    if hasattr(child, "lineno"):
                        guarded[child.lineno] = node.test.id
    return guarded


def _label_keys(root: Path, files: tuple[str, ...], required: str, function: str) -> tuple[str, int, list[str]]:
    """The keys of the dict literal holding `required` inside `function` (file, line, keys)."""
    relative, text = _first(root, files, f"def {function}(")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Dict) and required in _strings(ast.List(elts=list(inner.keys))):
                    return relative, inner.lineno, [k.value for k in inner.keys if isinstance(k, ast.Constant)]
    raise LookupError(f"no labels dict with {required!r} in {function} of {relative}")


def extract(root: Path) -> dict[str, Any]:
    """The facts of the release whose sources are under `root` (site-packages-like)."""
    relative, text = _first(root, COLLECTOR_FILES, 'name="sglang:num_running_reqs"')
    tree = ast.parse(text)
    guards = _guards(tree)
    wanted = {metric.full_name: metric for metric in Metric}
    metrics: dict[str, Any] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("MetricsCollector")):
        lists = _assigned_lists(cls)
        for call in (n for n in ast.walk(cls) if isinstance(n, ast.Call)):
            name = next((k.value for k in call.keywords if k.arg == "name"), None)
            if not (isinstance(name, ast.Constant) and name.value in wanted):
                continue
            labels = next(k.value for k in call.keywords if k.arg == "labelnames")
            kind = call.func.id if isinstance(call.func, ast.Name) else ast.unparse(call.func)
            metrics[wanted[name.value].value] = {
                "line": name.lineno, "kind": kind.lower(), "collector": cls.name,
                "extra_labels": _strings(labels), "buckets": _buckets(call, lists),
                "only_if": guards.get(name.lineno)}
    utils, utils_text = _first(root, UTILS_FILES, "def generate_buckets(")
    rules = sorted({s for node in ast.walk(ast.parse(utils_text)) if isinstance(node, ast.Compare)
                    and isinstance(node.left, ast.Name) and node.left.id == "rule" for s in _strings(node)})
    tokenizer_function = "tokenizer_metric_labels" if "def tokenizer_metric_labels(" in text \
        else "init_metric_collector_watchdog"
    tok_file, tok_line, tok_keys = _label_keys(root, TOKENIZER_LABEL_FILES, "model_name", tokenizer_function)
    sch_file, sch_line, sch_keys = _label_keys(root, SCHEDULER_LABEL_FILES, "tp_rank",
                                               "init_new" if "def init_new(" in text else "init_metrics")
    return {"collector_file": relative, "utils_file": utils, "bucket_rules": rules,
            "tokenizer_labels": {"file": tok_file, "line": tok_line, "keys": tok_keys},
            "scheduler_labels": {"file": sch_file, "line": sch_line, "keys": sch_keys},
            "metrics": dict(sorted(metrics.items()))}


def _number(value: float) -> str:
    """A bound as YAML reads it back as the same number (PyYAML takes `1e+06` for a string)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(facts: dict[str, dict[str, Any]]) -> str:
    """The fixture's text: YAML with a comment naming file and line above each fact."""
    lines = ["# SGLang's metrics as the released wheels define them, for deploy_lib/metrics/names.py.",
             "# Written by tests/helpers/sglang_metrics.py from the wheels on PyPI (each version: file and line).",
             "# tests/test_metrics_names.py checks names.py against this file, and this file against the wheels."]
    for version, fact in facts.items():
        lines += [f'"{version}":', f"  # sglang {version}: {fact['collector_file']}",
                  f"  collector_file: {fact['collector_file']}",
                  f"  # {fact['utils_file']} generate_buckets", f"  utils_file: {fact['utils_file']}",
                  f"  bucket_rules: [{', '.join(fact['bucket_rules'])}]"]
        for key in ("tokenizer_labels", "scheduler_labels"):
            where = fact[key]
            lines += [f"  # {where['file']}:{where['line']}",
                      f"  {key}: {{file: {where['file']}, line: {where['line']}, keys: [{', '.join(where['keys'])}]}}"]
        lines.append("  metrics:")
        for name, metric in fact["metrics"].items():
            bounds = metric["buckets"]
            buckets = "null" if bounds is None else "[" + ", ".join(_number(b) for b in bounds) + "]"
            lines += [f"    # {fact['collector_file']}:{metric['line']} ({metric['collector']})",
                      f"    {name}: {{line: {metric['line']}, kind: {metric['kind']}, collector: {metric['collector']},"
                      f" extra_labels: [{', '.join(metric['extra_labels'])}], only_if: {metric['only_if'] or 'null'},",
                      f"      buckets: {buckets}}}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from helpers.wheelcache import unpacked

    print(render({version: extract(unpacked("sglang", version)) for version in VERSIONS}), end="")
