"""Every user task in one invoke Collection: the namespace of `sglang-deploy`, mounted by the checkout's tasks.py
(which adds the sandbox and demo tasks); and the families its help lists them by."""

from __future__ import annotations

from invoke import Collection

from deploy_cli import deploy, inspect, lifecycle, models, patches, project, report, router, tune, venv

# The families of `sglang-deploy --help`, in its order: a task's family is the module its body is written in.
FAMILIES = {
    deploy.__name__: "Releases: what a profile becomes, and taking hosts to it or back",
    lifecycle.__name__: "A host's server and its store, without a new release",
    inspect.__name__: "Reading a host: state, history, journal, benchmark, GPUs",
    report.__name__: "Report",
    tune.__name__: "Tuning",
    patches.__name__: "Patch sets",
    venv.__name__: "Virtual environments on the host",
    models.__name__: "Models",
    router.__name__: "SGLang's router in front of a group",
    project.__name__: "The project and the tool",
}


def user_tasks() -> Collection:
    tasks = Collection(deploy.render, deploy.plan, deploy.schema, deploy.deploy, deploy.rollback, lifecycle.adopt,
                       lifecycle.stop, lifecycle.start, lifecycle.restart, lifecycle.uninstall, lifecycle.unlock,
                       inspect.releases, inspect.status, inspect.logs, inspect.bench, inspect.gpu_check,
                       inspect.workload, report.report,
                       patches.patch, patches.patch_fusion, project.init, project.docs, project.version)
    tasks.add_collection(Collection(patches.patches_list, patches.patches_check, patches.patches_audit,
                                    patches.patches_enable, patches.patches_disable), name="patches")
    tasks.add_collection(Collection(venv.venv_build, venv.venv_adopt, venv.venv_list, venv.venv_remove), name="venv")
    tasks.add_collection(Collection(models.model_list), name="model")
    tasks.add_collection(Collection(router.router_deploy, router.router_status), name="router")
    tasks.add_collection(tune.collection, name="tune")
    return tasks


__all__ = ["FAMILIES", "user_tasks"]
