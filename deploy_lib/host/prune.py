"""Prune after a deploy: releases beyond keep-N, leftovers and damaged releases, then the venvs and staged model
revisions no kept release uses, decided from one read of what is on the host."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

from deploy_lib.host.models import (
    FACT_CACHE,
    doomed_models,
    listing_steps,
    model_locations,
    parse_stored,
    prune_models,
)
from deploy_lib.progress import Progress
from deploy_lib.remote import Put, Remote, Step, StepResult
from deploy_lib.remote.readings import ANY_EXIT
from deploy_lib.store import (
    HEALTHY,
    ReleaseRecord,
    StoreFacts,
    StoreLayout,
    Tags,
    append_history,
    describe_pruned_releases,
    history_entry,
    parse_store_facts,
    prune_releases,
    release_fact_steps,
    releases_to_prune,
)

# The venvs' modules load when a prune is decided, never for a no-op deploy, which imports this module unused.


def store_read_steps(layout: StoreLayout) -> list[Step | Put]:
    """The store's releases, current and history, and its venvs."""
    from deploy_lib.host.venv_store import store_fact_steps as venv_store_fact_steps

    return [*release_fact_steps(layout), *venv_store_fact_steps(layout)]


def prune_read_steps(layout: StoreLayout, releases: Sequence[ReleaseRecord]) -> list[Step | Put]:
    """What prune decides from: the store's releases, current and history, its venvs, and the weights kept where
    `releases` keep theirs."""
    return [*store_read_steps(layout), *listing_steps(model_locations(releases))]


def around_the_restart(reads: Sequence[Step | Put]) -> tuple[list[Step | Put], list[Step]]:
    """`prune_read_steps` as (before the switch, after the restart). The store's reads see it as the switch finds it;
    a weights cache's listing starts a Python (0.3-0.4 s on a guest) and reads nothing the switch changes, so it runs
    while the server starts, where it must not fail the round trip: any exit is a reading (an unreadable listing
    prunes no weights)."""
    def slow(step: Step | Put) -> bool:
        return isinstance(step, Step) and step.name.startswith(FACT_CACHE)
    return ([step for step in reads if not slow(step)],
            [replace(step, ok=ANY_EXIT) for step in reads if isinstance(step, Step) and slow(step)])


def prune(remote: Remote, layout: StoreLayout, keep: int, tags: Tags, progress: Progress,
          read: Sequence[StepResult] | None = None) -> tuple[str, ...]:
    """Prune decided from a fresh read (`prune_read_steps`, or read here) of what is on the host after the commit,
    current and history included; the removal and its history line in one round trip."""
    if read is None:  # the store first, then the weights its releases keep
        read = remote.run(store_read_steps(layout))
        read = [*read, *remote.run(listing_steps(model_locations(parse_store_facts(layout, read).releases)))]
    batch, removed = prune_batch(layout, keep, tags, read, parse_store_facts(layout, read))
    if removed:
        remote.run(batch)
        progress.note("pruned " + "; ".join(removed))
    return removed


def prune_batch(layout: StoreLayout, keep: int, tags: Tags, read: Sequence[StepResult], store: StoreFacts
                ) -> tuple[list[Step | Put], tuple[str, ...]]:
    """Releases beyond keep-N (never current or the last healthy), leftovers and damaged releases, then venvs and
    staged model revisions no kept release uses: the steps that remove them and record what was removed in history
    (a damaged release with its reason), and those phrases; nothing when nothing is to go. `read` holds
    `prune_read_steps`'s results, `store` the release store as the removal will find it."""
    from deploy_lib.host.venv_lifecycle import describe_prune, plan_prune, prune_steps
    from deploy_lib.host.venv_store import parse_store_facts as parse_venv_store_facts
    from deploy_lib.venvs import release_venv_hash

    venv_store = parse_venv_store_facts(layout, read)
    doomed = releases_to_prune(store, keep)
    kept_venvs = [release_venv_hash(layout, str(r.metadata.get("venv", ""))) for r in store.releases
                  if r.id not in doomed]
    venv_plan = plan_prune(venv_store, kept_venvs)
    stored = parse_stored(read, store.releases)
    kept = {r.id for r in store.releases if r.id not in doomed}
    removed = (*describe_pruned_releases(store, doomed), *describe_prune(venv_plan),
               *(f"model {item.name} {item.version[:12]}" for item in doomed_models(stored, kept)))
    if not removed:
        return [], ()
    return [*prune_releases(layout, doomed), *prune_steps(layout, venv_plan),
            *prune_models(stored, kept, model_locations(store.releases)),
            *append_history(layout, history_entry("prune", HEALTHY, tags, datetime.now(UTC),
                                                  "removed " + "; ".join(removed)))], removed


def prune_after_deploy(layout: StoreLayout, keep: int, tags: Tags, read: Sequence[StepResult]
                       ) -> tuple[list[Step | Put], tuple[str, ...]]:
    """`prune_batch` for the round trip that commits the deploy of `tags.release`, from `prune_read_steps`'s results
    read (under the lock) before its switch: the store as the commit leaves it, `current` naming the release and
    history's last line recording it healthy."""
    store = parse_store_facts(layout, read)
    committed = replace(store, current=tags.release,
                        history=(*store.history, history_entry("deploy", HEALTHY, tags, datetime.now(UTC))))
    return prune_batch(layout, keep, tags, read, committed)
