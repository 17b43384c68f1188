"""Patch sets on a host: check, enable (a derived venv + a normal deploy), disable, audit.

The text work is deploy_lib/patches.py (pure); the venv work is deploy_lib/venvs.py; the release goes through
deploy.deploy, so the readiness ladder and the rollback apply to a patched release like to any other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from deploy_lib import cuda_toolkit, patches
from deploy_lib.deploy import Options, Outcome, VenvChoice, deploy
from deploy_lib.errors import PreflightError
from deploy_lib.facts import gpu_step, parse_gpus
from deploy_lib.profile import LoadedProfile
from deploy_lib.progress import Progress
from deploy_lib.project import Target
from deploy_lib.remote import Remote, Step
from deploy_lib.server_args import launch_environment
from deploy_lib.store import StoreLayout, read_store_facts
from deploy_lib.venvs import (
    adopt,
    cache_dir_steps,
    cache_environment,
    derive,
    parse_store_facts,
    release_venv_hash,
    store_fact_steps,
)

# Run by the venv's own python: where its site-packages is and which distributions are installed.
_VENV_FACTS = (
    "import json,sysconfig,importlib.metadata as m\n"
    "names=('sglang','flashinfer-python','flashinfer-jit-cache','torch')\n"
    "def v(n):\n"
    "    try: return m.version(n)\n"
    "    except m.PackageNotFoundError: return None\n"
    "print(json.dumps({'purelib':sysconfig.get_paths()['purelib'],'versions':{n:v(n) for n in names}}))\n"
)


@dataclass(frozen=True)
class PatchContext:
    """What a patch decision needs to know about the host, read in one go."""

    layout: StoreLayout
    venv: PurePosixPath
    venv_hash: str | None            # set when the venv is a managed one (venvs/<hash>)
    site_packages: PurePosixPath
    versions: Mapping[str, str]
    gpu_arch: str
    compute_cap: str
    files: Mapping[str, str]
    record: patches.PatchRecord | None
    toolkit: cuda_toolkit.CudaToolkit
    environment: Mapping[str, str]   # the release's, for FLASHINFER_CUDA_ARCH_LIST

    @property
    def toolkit_problem(self) -> str | None:
        """Why FlashInfer cannot JIT-build the fusion's kernels with the toolkit at CUDA_HOME, or None."""
        return cuda_toolkit.sm12x_problem(self.versions.get(patches.FLASHINFER), self.compute_cap, self.toolkit,
                                          self.environment)

    @property
    def toolkit_line(self) -> str:
        return cuda_toolkit.describe(self.versions.get(patches.FLASHINFER), self.compute_cap, self.toolkit,
                                     self.environment)

    @property
    def base_hash(self) -> str | None:
        """The unpatched venv this one was derived from (itself when it is not derived)."""
        return self.record.base_venv if self.record and self.record.base_venv else self.venv_hash


def patched_profile(loaded: LoadedProfile, patch_set: patches.PatchSet) -> LoadedProfile:
    """The profile a release on the patched venv runs: the base with the patch set's feature turned on."""
    return _with_feature(base_profile(loaded, patch_set), patch_set, on=True)


def base_profile(loaded: LoadedProfile, patch_set: patches.PatchSet) -> LoadedProfile:
    """The unpatched profile: the patch set's feature off, and without the name suffix a patched release carries
    (so the profile of a host's patched current release can be enabled or disabled again)."""
    return _with_feature(loaded, patch_set, on=False)


def _with_feature(loaded: LoadedProfile, patch_set: patches.PatchSet, on: bool) -> LoadedProfile:
    feature = patch_set.meta.enables_feature
    if feature is None:
        return loaded
    profile = loaded.profile
    features = profile.features.model_copy(update={feature: on})
    base_name = loaded.name.removesuffix(f"+{patch_set.name}")
    return loaded.model_copy(update={"name": f"{base_name}+{patch_set.name}" if on else base_name,
                                     "profile": profile.model_copy(update={"features": features})})


def current_venv(remote: Remote, layout: StoreLayout, loaded: LoadedProfile, target: Target) -> PurePosixPath:
    """The venv of the host's current release; without one, the venv the profile would deploy."""
    store = read_store_facts(remote, layout)
    record = store.release(store.current) if store.current else None
    if record is not None and record.metadata.get("venv"):
        return PurePosixPath(str(record.metadata["venv"]))
    return PurePosixPath(target.venv_override or loaded.profile.service.venv)


def read_context(remote: Remote, patch_set: patches.PatchSet, loaded: LoadedProfile, target: Target,
                 paths: tuple[str, ...] | None = None) -> PatchContext:
    layout = target.layout(loaded.profile.service.name)
    venv = current_venv(remote, layout, loaded, target)
    environment = launch_environment(loaded.profile)
    home = cuda_toolkit.cuda_home(environment)
    gpu_result, venv_result, record_result, *toolkit_results = remote.run([
        gpu_step("patch facts: GPUs"),
        Step("patch facts: venv", (str(venv / "bin" / "python3"), "-I", "-"), stdin=_VENV_FACTS.encode(),
             ok=frozenset({0, 1, 127}), timeout_s=60),
        Step("patch facts: record", ("cat", "--", str(venv / patches.RECORD_FILE)), ok=frozenset({0, 1})),
        *cuda_toolkit.toolkit_steps(home),
    ])
    gpus, gpu_error = parse_gpus(gpu_result)
    if not gpus:
        raise PreflightError(f"{target.host.name}: cannot read the GPUs: {gpu_error or 'nvidia-smi lists none'}")
    if venv_result.exit_code != 0:
        raise PreflightError(f"{target.host.name}: the venv {venv} does not run: "
                             f"{(venv_result.stderr or venv_result.stdout).strip()[-300:]}")
    venv_facts = json.loads(venv_result.stdout.strip().splitlines()[-1])
    versions = {name: version for name, version in venv_facts["versions"].items() if version}
    record = (patches.PatchRecord.from_json(record_result.stdout, f"{venv / patches.RECORD_FILE}")
              if record_result.exit_code == 0 else None)
    site_packages = PurePosixPath(venv_facts["purelib"])
    if paths is None:
        paths = patches.files_needed(patch_set, versions.get(patches.SGLANG), versions.get(patches.FLASHINFER))
    files = patches.files_from_results(list(paths), remote.run(patches.read_steps(site_packages, paths)))
    return PatchContext(layout=layout, venv=venv, venv_hash=release_venv_hash(layout, str(venv)),
                        site_packages=site_packages, versions=versions, gpu_arch=gpus[0].arch,
                        compute_cap=gpus[0].compute_cap, files=files, record=record,
                        toolkit=cuda_toolkit.parse_toolkit(home, {r.step.name: r for r in toolkit_results}),
                        environment=environment)


def check(remote: Remote, patch_set: patches.PatchSet, loaded: LoadedProfile, target: Target) -> patches.CheckReport:
    """Each target's state in the current release's venv, with file and line; nothing is changed."""
    context = read_context(remote, patch_set, loaded, target)
    report = patches.check(patch_set, context.files, context.versions, gpu_arch=context.gpu_arch,
                           nnodes=loaded.profile.parallel.nnodes, record=context.record)
    return replace(report, toolkit=context.toolkit_line)


def audit(remote: Remote, patch_set: patches.PatchSet, loaded: LoadedProfile, target: Target) -> patches.AuditReport:
    context = read_context(remote, patch_set, loaded, target, paths=patches.audit_paths(patch_set))
    return replace(patches.audit(context.files, patch_set.meta.audit), toolkit=context.toolkit_line)


def _managed_base(remote: Remote, context: PatchContext, progress: Progress) -> str:
    """The hash of the unpatched venv; a hand-made venv is adopted first (a hard-linked, immutable copy)."""
    if context.base_hash is not None:
        return context.base_hash
    progress.note(f"adopting {context.venv} as a managed venv (a hard-linked copy; the original is not changed)")
    return adopt(remote, context.layout, context.venv).hash


def enable(remote: Remote, patch_set: patches.PatchSet, base: LoadedProfile, patched: LoadedProfile, target: Target,
           progress: Progress, options: Options) -> tuple[patches.CheckReport, Outcome]:
    """Check every target without writing, make the patched venv as a derived venv, deploy `patched` on it."""
    context = read_context(remote, patch_set, base, target)
    if context.toolkit_problem:  # refused before any venv is made: deploy's preflight would refuse the release
        raise PreflightError(f"{target.host.name}: allreduce fusion cannot start: {context.toolkit_problem}",
                             cuda_toolkit.FIX_HINT)
    enabled = patches.enable(patch_set, context.files, context.versions, gpu_arch=context.gpu_arch,
                             nnodes=patched.profile.parallel.nnodes)
    for warning in enabled.report.warnings:
        progress.note(warning)
    base_hash = _managed_base(remote, context, progress)
    base_venv = context.layout.venvs / base_hash
    prefix = context.site_packages.relative_to(context.venv)
    record = enabled.record.model_copy(update={"base_venv": base_hash})
    replaced = {str(prefix / path): text.encode() for path, text in enabled.files.items()}
    replaced[patches.RECORD_FILE] = record.to_json().encode()
    derived = derive(remote, context.layout, base_hash, replaced) if enabled.files else None
    venv_hash = derived.hash if derived else base_hash
    workspace = PurePosixPath(cache_environment(context.layout, venv_hash)["FLASHINFER_WORKSPACE_BASE"])
    remote.run([*cache_dir_steps(context.layout, venv_hash, patched.profile.service.user),
                *patches.clear_jit_cache_steps(patch_set, workspace, context.versions, sudo=True)])
    venv = VenvChoice(str(derived.path if derived else base_venv), cache_environment(context.layout, venv_hash))
    outcome = deploy(patched, target, remote, progress, _with(options, venv, (patch_set.name,)))
    return enabled.report, outcome


def disable(remote: Remote, patch_set: patches.PatchSet, base: LoadedProfile, target: Target, progress: Progress,
            options: Options) -> Outcome:
    """Deploy `base` (fusion off) on the unpatched venv the current one was derived from; no file is rewritten."""
    context = read_context(remote, patch_set, base, target)
    if context.record is None or not context.record.base_venv:
        raise PreflightError(f"{target.host.name}: the current release's venv {context.venv} is not patched by "
                             f"{patch_set.name}", hint="`invoke patch-fusion --check` shows each target's state")
    layout = context.layout
    markers = parse_store_facts(remote.run(store_fact_steps(layout))).markers
    if context.record.base_venv not in markers:
        raise PreflightError(f"{target.host.name}: the unpatched venv {context.record.base_venv} is gone")
    venv = VenvChoice(str(layout.venvs / context.record.base_venv),
                      cache_environment(layout, context.record.base_venv))
    return deploy(base, target, remote, progress, _with(options, venv, ()))


def _with(options: Options, venv: VenvChoice, applied: tuple[str, ...]) -> Options:
    return replace(options, venv=venv, patches=applied)
