"""gpu-check: the GPUs' topology and peer-to-peer support, NCCL advice from them, and a verified all-reduce.

Pure parts (parsers of `nvidia-smi topo -m` / `topo -p2p r|w`, the advisor, the report of the all-reduce script's
JSON) are tested on real recorded output; the command `invoke gpu-check` (deploy_lib/commands/gpu_check.py) is the
one place that runs steps. The all-reduce runs on the host as deploy_lib/host_scripts/gpu_check.py under the release
venv's python, with the release's NCCL environment; it needs torch with CUDA there and says so when it is missing,
never faking a result.

    topology    `nvidia-smi topo` parsed, peer-to-peer support, the NCCL_P2P_LEVEL / NCCL_P2P_DISABLE advice
    allreduce   the all-reduce script's step, its sizes, and its JSON report parsed
    subject     what a check runs with (a release's or a profile's venv, TP size, NCCL environment), the report,
                and when a deploy runs it (preflight.gpu_check)
"""

from deploy_lib.gpu_check.allreduce import check_step, parse_check_output, parse_check_result, parse_sizes
from deploy_lib.gpu_check.subject import (
    REPORT_PREFIX,
    GpuCheckReport,
    check_batch,
    check_reasons,
    read_check_batch,
    subject_of_profile,
    subject_of_release,
)
from deploy_lib.gpu_check.topology import advise, parse_topology, parse_topology_results, topology_steps

__all__ = [
    "REPORT_PREFIX",
    "GpuCheckReport",
    "advise",
    "check_batch",
    "check_reasons",
    "check_step",
    "parse_check_output",
    "parse_check_result",
    "parse_sizes",
    "parse_topology",
    "parse_topology_results",
    "read_check_batch",
    "subject_of_profile",
    "subject_of_release",
    "topology_steps",
]
