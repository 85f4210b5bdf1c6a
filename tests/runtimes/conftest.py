"""The runtime tests run under the light control-plane venv (no torch) and execute the runtimes as
subprocesses with the runtime environment's Python, exactly as the rendered steps do:
``PYTHONPATH=<repo root> <runtime python> -m runtimes <step> --config-json …``.

Their fixtures (`runtime_python`, `seldon_python`, `digits`, `server_factory`) live in
tests/conftest.py, shared with the local-target and rollout tests.
"""
