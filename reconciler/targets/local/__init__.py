"""The `local` target: the same rendered manifests made live on this machine (target.LocalTarget);
Workflow steps as processes (executor, with Argo's semantics asked of upstream code: upstream),
model servers behind a weighted router (serving, router), a local Prometheus (monitoring), all
state in one SQLite database (state). This package imports none of its modules on purpose."""
