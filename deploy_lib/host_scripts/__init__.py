"""Scripts the host runs whole: each is sent as text to a python there (`python3 -` on stdin, or the release venv's
python), imports nothing of deploy_lib, and runs on Python >= 3.9. Callers read them with importlib.resources and
never import them to run; a new script the host runs goes here.

    probe           the readiness probe (health): every rung of the ladder in one call
    gpu_check       the NCCL all-reduce check, under the release venv's python with torch
    model_stage     plan or stage a model snapshot in the HF cache with the venv's huggingface_hub
    sglang_options  SGLang's launch options read out of its source with `ast`, cached beside the venv
    router          the router's /workers calls, on the router's host
    p2p_measure     gpu-check's per-pair GPU copy measurement
    venv_*          a venv's python facts, installed packages, relocation, inspection, verification, the uv binary
                    fetched and extracted, a tree's digest, where a package is imported from (venvs/host_scripts.py
                    sends them)
"""
