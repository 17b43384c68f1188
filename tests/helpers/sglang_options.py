"""A synthetic sglang source tree written to disk."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


SYNTHETIC = {
    "sglang-9.9.9.dist-info/METADATA": "Metadata-Version: 2.4\nName: sglang\nVersion: 9.9.9.post1\n\nbody\n",
    "flashinfer_python-0.7.2.dist-info/METADATA": "Name: flashinfer-python\nVersion: 0.7.2\n",
    "sglang/srt/choices.py": """
        BASE = ["flashinfer", "triton"]
        ATTENTION_CHOICES = BASE + ["fa3", *["trtllm_mha"]]
        class Backend:
            FULL = "full"
            DISABLED = "disabled"
            ALL = (FULL, DISABLED)
    """,
    "sglang/srt/parsers.py": """
        class Parser:
            Detectors: dict = {"glm45": object, "qwen3": object}
    """,
    "sglang/srt/actions.py": """
        import argparse
        class DeprecatedStoreTrueAction(argparse.Action):
            def __init__(self, option_strings, dest, new_flag=None, nargs=0, **kwargs):
                super().__init__(option_strings, dest, nargs=nargs, **kwargs)
        class DeprecatedAction(argparse.Action):
            def __init__(self, option_strings, dest, error_message=None, nargs=0, **kwargs):
                super().__init__(option_strings, dest, nargs=nargs, **kwargs)
        class PathAction(argparse.Action):
            pass
    """,
    "sglang/srt/fields.py": """
        import argparse
        from typing import List, Literal, Optional
        from sglang.srt.choices import ATTENTION_CHOICES, Backend
        A = Annotated
        class Parallel:
            tp_size: A[int, Arg(help="TP.", aliases=["--tensor-parallel-size"])] = 1
            not_a_flag: int = 3
            hidden: A[int, Arg(help="internal", no_cli=True)] = 0
        class Exec:
            attention_backend: A[Optional[str], Arg(help="Kernel.", choices=ATTENTION_CHOICES)] = None
            cuda_graph_backend_decode: A[Optional[str], Arg(help="Decode graphs.", choices=Backend.ALL)] = None
            load_mode: A[Literal["eager", "lazy"], "How to load."] = "eager"
            cuda_graph_bs: A[Optional[List[int]], "Batch sizes."] = None
            enable_metrics: A[bool, "Metrics."] = False
            enable_mm: A[bool, Arg(help="Multimodal.", action=argparse.BooleanOptionalAction)] = None
            lora_paths: A[Optional[List[str]], Arg(help="LoRA.", action=PathAction,
                                                     action_kwargs={"nargs": "*", "type": str})] = None
            model_path: A[str, Arg(help="Model.", aliases=["--model"])]
    """,
    "sglang/srt/server_args.py": """
        import argparse
        from sglang.srt.actions import DeprecatedAction, DeprecatedStoreTrueAction
        from sglang.srt.fields import Exec, Parallel
        from sglang.srt.parsers import Parser

        def _parser_names():
            import sys
            from sglang.srt.parsers import Parser as Registry
            if "x" in sys.modules:
                return ["never"]
            return list(Registry.Detectors)

        class ServerArgs:
            host: A[str, "Host."] = "127.0.0.1"
            port: A[int, "Port."] = 30000
            port: A[int, "Port, annotated twice: one field."] = 30000

            @staticmethod
            def add_cli_args(parser):
                add_cli_args_from_dataclass(parser, ServerArgs)
                names = _parser_names()
                parser.add_argument("--reasoning-parser", type=str, choices=["auto"] + names)
                parser.add_argument("--kv-mode", choices=[m.name.lower() for m in Modes])
                parser.add_argument("--disable-cuda-graph", action=DeprecatedStoreTrueAction, help="Deprecated.")
                parser.add_argument("--old-flag", action=DeprecatedAction, error_message="use --new-flag")
                parser.add_argument("--mono", action=DeprecatedStoreTrueAction, nargs=None, choices=["amd"])
                parser.add_argument("--ratio", type=float, help="Ratio (deprecated).")
                parser.add_argument("--tp", type=int)

        _INPUT_NAMESPACES = [Parallel, Exec]
        collect_input_fields(_INPUT_NAMESPACES)
    """,
}
