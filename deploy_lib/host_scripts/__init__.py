"""Scripts the host runs whole: each is sent as text to a python there (`python3 -` on stdin, or the release venv's
python), imports nothing of deploy_lib, and runs on Python >= 3.9. Callers read them with importlib.resources and
never import them to run; a new script the host runs goes here (the venv scripts live beside venvs/host_scripts.py,
which sends them).

    probe           the readiness probe (health): every rung of the ladder in one call
    gpu_check       the NCCL all-reduce check, under the release venv's python with torch
    model_stage     plan or stage a model snapshot in the HF cache with the venv's huggingface_hub
    sglang_options  SGLang's launch options read out of its source with `ast`, cached beside the venv
"""
