"""Simulated SGLang server for the sandbox VM: only the GPUs and the model are simulated.

Installed beside the real sglang and flashinfer-python sources (their wheels installed with --no-deps),
it makes `python -m sglang.launch_server ARGS` run the simulation (see hook.py) while the upstream files
stay on disk, unmodified, to be read, patched and checked.
"""
