"""The command line: options in, one library call, output. Each task family is a module (deploy, lifecycle,
inspect, venv, patches, router, models, project), `collection.tasks` mounts them for `sglang-deploy` and the
checkout's tasks.py; `present` and `reports` are the terminal side, `common` the plumbing every task shares."""
