"""Every user task in one invoke Collection: the namespace of `sglang-deploy`, mounted by the checkout's tasks.py
(which adds the sandbox and demo tasks)."""

from __future__ import annotations

from invoke import Collection

from deploy_cli import deploy, inspect, lifecycle, models, patches, project, report, router, tune, venv


def user_tasks() -> Collection:
    tasks = Collection(deploy.render, deploy.plan, deploy.schema, deploy.deploy, deploy.rollback, lifecycle.adopt,
                       lifecycle.stop, lifecycle.start, lifecycle.restart, lifecycle.uninstall, lifecycle.unlock,
                       inspect.releases, inspect.status, inspect.logs, inspect.bench, inspect.gpu_check, report.report,
                       patches.patch, patches.patch_fusion, project.init, project.version)
    tasks.add_collection(Collection(patches.patches_list, patches.patches_check, patches.patches_audit,
                                    patches.patches_enable, patches.patches_disable), name="patches")
    tasks.add_collection(Collection(venv.venv_build, venv.venv_adopt, venv.venv_list, venv.venv_remove), name="venv")
    tasks.add_collection(Collection(models.model_list), name="model")
    tasks.add_collection(Collection(router.router_deploy, router.router_status), name="router")
    tasks.add_collection(tune.collection, name="tune")
    return tasks


__all__ = ["user_tasks"]
