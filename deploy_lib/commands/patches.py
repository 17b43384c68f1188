"""Patch sets on a host: check, enable (a derived venv + a normal deploy), disable, audit.

The text work is the rest of deploy_lib/patches (pure); the venv work is deploy_lib/venvs/; the release goes through
deploy.deploy, so the readiness ladder and the rollback apply to a patched release like to any other.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from urllib.parse import quote

from deploy_lib import patches
from deploy_lib.commands.deploy import Options, Outcome, PatchedVenv, SweepCandidate, deploy
from deploy_lib.deploy.plan import VenvChoice
from deploy_lib.deploy.project import Target
from deploy_lib.errors import PreflightError
from deploy_lib.facts import cuda_toolkit
from deploy_lib.facts.host import gpu_step, parse_gpus
from deploy_lib.host.store import host_lock, read_store_facts
from deploy_lib.host.venv_adopt import adopt
from deploy_lib.host.venv_derive import derive
from deploy_lib.host.venv_store import parse_store_facts, store_fact_steps
from deploy_lib.patches.profiles import base_profile as base_profile  # callers name them on_host.*
from deploy_lib.patches.profiles import patched_profile as patched_profile
from deploy_lib.profile import LoadedProfile
from deploy_lib.progress import Progress
from deploy_lib.release.server_args import launch_environment
from deploy_lib.remote import Remote, readings
from deploy_lib.remote.readings import Fact
from deploy_lib.store import StoreLayout
from deploy_lib.venvs import InstalledFacts, cache_dir_steps, cache_environment, installed_fact, release_venv_hash


@dataclass(frozen=True)
class PatchContext:
    """What a patch decision needs to know about the host, read in one go."""

    layout: StoreLayout
    venv: PurePosixPath
    venv_hash: str | None            # set when the venv is a managed one (venvs/<hash>)
    installed: InstalledFacts        # versions, and where each package's files really are
    gpu_arch: str
    compute_cap: str
    files: Mapping[str, str]
    record: patches.PatchRecord | None
    toolkit: cuda_toolkit.CudaToolkit | None  # read when the patch set has FlashInfer JIT-build its kernels
    environment: Mapping[str, str]   # the release's, for FLASHINFER_CUDA_ARCH_LIST

    @property
    def toolkit_problem(self) -> str | None:
        """Why FlashInfer cannot JIT-build the patched kernels with the toolkit at CUDA_HOME, or None."""
        if self.toolkit is None:
            return None
        return cuda_toolkit.sm12x_problem(self.versions.get(patches.FLASHINFER), self.compute_cap, self.toolkit,
                                          self.environment)

    @property
    def toolkit_line(self) -> str | None:
        if self.toolkit is None:
            return None
        return cuda_toolkit.describe(self.versions.get(patches.FLASHINFER), self.compute_cap, self.toolkit,
                                     self.environment)

    @property
    def versions(self) -> Mapping[str, str]:
        return self.installed.versions

    @property
    def base_hash(self) -> str | None:
        """The unpatched venv this one was derived from (itself when it is not derived)."""
        return self.record.base_venv if self.record and self.record.base_venv else self.venv_hash


def current_venv(remote: Remote, layout: StoreLayout, loaded: LoadedProfile, target: Target) -> PurePosixPath:
    """The venv of the host's current release; without one, the venv the profile would deploy."""
    store = read_store_facts(remote, layout)
    record = store.release(store.current) if store.current else None
    if record is not None and record.metadata.get("venv"):
        return PurePosixPath(str(record.metadata["venv"]))
    return PurePosixPath(target.venv_of(loaded.profile))


def read_context(remote: Remote, patch_set: patches.PatchSet, loaded: LoadedProfile, target: Target,
                 paths: tuple[str, ...] | None = None) -> PatchContext:
    layout = target.layout(loaded.profile.service.name)
    venv = current_venv(remote, layout, loaded, target)
    environment = launch_environment(loaded.profile)
    home = cuda_toolkit.cuda_home(environment) if patch_set.meta.jit_cache else None
    gpus_fact = Fact(gpu_step("patch facts: GPUs"), parse_gpus)
    installed_read = installed_fact(venv, patches.distributions(patch_set), patches.top_level_packages(patch_set),
                                    "patch facts: venv")
    record_read = patches.record_fact(venv)
    found = readings.read(remote, [gpus_fact, installed_read, record_read,
                                   *(cuda_toolkit.toolkit_steps(home) if home else ())])
    gpus, gpu_error = found.value(gpus_fact)
    if not gpus:
        raise PreflightError(f"{target.host.name}: cannot read the GPUs: {gpu_error or 'nvidia-smi lists none'}")
    installed = found.value(installed_read)
    if paths is None:
        paths = patches.files_needed(patch_set, installed.versions)
    file_facts = patches.file_facts({path: installed.location(path) for path in paths})
    texts = readings.read(remote, file_facts.values())
    files = {path: text for path, fact in file_facts.items() if (text := texts.value(fact)) is not None}
    return PatchContext(layout=layout, venv=venv, venv_hash=release_venv_hash(layout, str(venv)), installed=installed,
                        gpu_arch=gpus[0].arch, compute_cap=gpus[0].compute_cap, files=files,
                        record=found.value(record_read),
                        toolkit=cuda_toolkit.parse_toolkit(home, found) if home else None, environment=environment)


def _sources(context: PatchContext, patch_set: patches.PatchSet) -> dict[str, str]:
    """Distribution -> where its files were read, for the patch set's packages not installed plainly in the venv."""
    return {name: origin.describe() for name, origin in context.installed.origins.items()
            if name in patch_set.meta.packages}


def check(remote: Remote, patch_set: patches.PatchSet, loaded: LoadedProfile, target: Target) -> patches.CheckReport:
    """Each target's state in the current release's venv, with file and line; nothing is changed."""
    context = read_context(remote, patch_set, loaded, target)
    report = patches.check(patch_set, context.files, context.versions, gpu_arch=context.gpu_arch,
                           nnodes=loaded.profile.parallel.nnodes, record=context.record)
    return replace(report, toolkit=context.toolkit_line, sources=_sources(context, patch_set))


def audit(remote: Remote, patch_set: patches.PatchSet, loaded: LoadedProfile, target: Target) -> patches.AuditReport:
    context = read_context(remote, patch_set, loaded, target, paths=patches.audit_paths(patch_set))
    return replace(patches.audit(patch_set, context.files), toolkit=context.toolkit_line,
                   sources=_sources(context, patch_set))


def _managed_base(remote: Remote, context: PatchContext, progress: Progress) -> str:
    """The hash of the unpatched venv; a hand-made venv is adopted first (a hard-linked, immutable copy)."""
    if context.base_hash is not None:
        return context.base_hash
    progress.note(f"adopting {context.venv} as a managed venv (a hard-linked copy; the original is not changed)")
    return adopt(remote, context.layout, context.venv).hash


def enable(remote: Remote, patch_set: patches.PatchSet, base: LoadedProfile, patched: LoadedProfile, target: Target,
           progress: Progress, options: Options, before_restart: Callable[[], None] | None = None,
           sweep: SweepCandidate | None = None) -> tuple[patches.CheckReport, Outcome]:
    """Check every target without writing, make the patched venv as a derived venv, deploy `patched` on it
    (`before_restart` and `sweep` as `deploy` takes them).

    All under the host's lock: adopting, deriving, clearing the JIT cache and the deploy are one change."""
    layout = target.layout(base.profile.service.name)
    with host_lock(remote, layout, f"patch {patch_set.name} and deploy {patched.name}", target.host.name):
        report, venv = _patched_venv(remote, patch_set, base, patched, target, progress)
        return report, deploy(patched, target, remote, progress, options, before_restart=before_restart,
                              patched=PatchedVenv(venv, (patch_set.name,)), sweep=sweep)


def _patched_venv(remote: Remote, patch_set: patches.PatchSet, base: LoadedProfile, patched: LoadedProfile,
                  target: Target, progress: Progress) -> tuple[patches.CheckReport, VenvChoice]:
    """The patch set's report and the venv it made (derived from the managed base venv, JIT cache cleared)."""
    context = read_context(remote, patch_set, base, target)
    patches.refuse_another_sets_record(patch_set, context.record)
    if context.toolkit_problem:  # refused before any venv is made: deploy's preflight would refuse the release
        raise PreflightError(f"{target.host.name}: {patch_set.name}'s kernels cannot be built: "
                             f"{context.toolkit_problem}", cuda_toolkit.FIX_HINT)
    if context.record is not None and context.record.patch_set == patch_set.name and context.venv_hash is not None:
        return _reused_venv(patch_set, patched, context, context.venv_hash)
    enabled = patches.enable(patch_set, context.files, context.versions, gpu_arch=context.gpu_arch,
                             nnodes=patched.profile.parallel.nnodes)
    for warning in enabled.report.warnings:
        progress.note(warning)
    base_hash = _managed_base(remote, context, progress)
    base_venv = context.layout.venvs / base_hash
    replaced, copied = _derived_files(context, enabled, base_hash)
    for source in copied.values():
        progress.note(f"{source} is outside the venv (an editable install): the patched venv gets its own copy of it; "
                      "the checkout is never written")
    derived = derive(remote, context.layout, base_hash, replaced, copied=copied) if enabled.files else None
    venv_hash = derived.hash if derived else base_hash
    workspace = PurePosixPath(cache_environment(context.layout, venv_hash)["FLASHINFER_WORKSPACE_BASE"])
    remote.run([*cache_dir_steps(context.layout, venv_hash, patched.profile.service.user),
                *patches.clear_jit_cache_steps(patch_set, workspace, context.versions, sudo=True)])
    venv = VenvChoice(str(derived.path if derived else base_venv), cache_environment(context.layout, venv_hash))
    return enabled.report, venv


def _reused_venv(patch_set: patches.PatchSet, patched: LoadedProfile, context: PatchContext, venv_hash: str
                 ) -> tuple[patches.CheckReport, VenvChoice]:
    """The current release runs on this patch set's venv already (a sweep's candidates on one patch set run one
    after another): the next release runs on it as it is, its JIT cache kept warm; PatchConflict when its files are
    no longer as the record says."""
    report = patches.check(patch_set, context.files, context.versions, gpu_arch=context.gpu_arch,
                           nnodes=patched.profile.parallel.nnodes, record=context.record)
    if report.conflicts:
        raise patches.PatchConflict("nothing written: the patched venv's targets are no longer as its record says:\n"
                                    + "\n".join(report.summary_lines()),
                                    hint="`invoke patches.disable` returns to the base venv; enable it from there")
    return report, VenvChoice(str(context.venv), cache_environment(context.layout, venv_hash))


def _derived_files(context: PatchContext, enabled: patches.Enabled,
                   base_hash: str) -> tuple[dict[str, bytes], dict[str, PurePosixPath]]:
    """The derived venv's new files (relative to the venv) and the package trees copied into it (relative path in
    the venv -> source directory on the host).

    A package imported from outside the venv (an editable install's checkout) cannot be hard-linked from a checkout
    the tool does not own, and must not change under a release when someone edits or pulls there: the patched venv
    gets its own copy, which shadows the checkout (site-packages comes before an editable finder or .pth path).
    The copied distribution's direct_url.json then says "installed from that directory", no longer editable.
    """
    installed, venv = context.installed, context.venv
    prefix = installed.site_packages.relative_to(venv)
    record = enabled.record.model_copy(update={"base_venv": base_hash})
    replaced = {str(prefix / path): text.encode() for path, text in enabled.files.items()}
    replaced[patches.RECORD_FILE] = record.to_json().encode()
    outside = installed.outside()
    tops = sorted({path.split("/", 1)[0] for path in enabled.files} & set(outside))
    copied = {str(prefix / top): outside[top] / top for top in tops}
    dists = {v.package for v in enabled.report.variants.values() if v.file and v.file.split("/", 1)[0] in tops}
    for name in sorted(dists):
        origin = installed.origins.get(name)
        if origin is not None and origin.editable and origin.direct_url and origin.direct_url.is_relative_to(venv):
            url = {"url": f"file://{quote(str(origin.directory))}", "dir_info": {}}
            replaced[str(origin.direct_url.relative_to(venv))] = (json.dumps(url) + "\n").encode()
    return replaced, copied


def disable(remote: Remote, patch_set: patches.PatchSet, base: LoadedProfile, target: Target, progress: Progress,
            options: Options) -> Outcome:
    """Deploy `base` (fusion off) on the unpatched venv the current one was derived from; no file is rewritten."""
    layout = target.layout(base.profile.service.name)
    with host_lock(remote, layout, f"unpatch {patch_set.name} and deploy {base.name}", target.host.name):
        return _disable(remote, patch_set, base, target, progress, options)


def _disable(remote: Remote, patch_set: patches.PatchSet, base: LoadedProfile, target: Target, progress: Progress,
             options: Options) -> Outcome:
    context = read_context(remote, patch_set, base, target)
    patches.refuse_another_sets_record(patch_set, context.record)
    if context.record is None or not context.record.base_venv:
        raise PreflightError(f"{target.host.name}: the current release's venv {context.venv} is not patched by "
                             f"{patch_set.name}",
                             hint=f"`invoke patch --name {patch_set.name} --check` shows each target's state")
    layout = context.layout
    markers = parse_store_facts(layout, remote.run(store_fact_steps(layout))).markers
    if context.record.base_venv not in markers:
        raise PreflightError(f"{target.host.name}: the unpatched venv {context.record.base_venv} is gone")
    venv = VenvChoice(str(layout.venvs / context.record.base_venv),
                      cache_environment(layout, context.record.base_venv))
    return deploy(base, target, remote, progress, options, patched=PatchedVenv(venv))
