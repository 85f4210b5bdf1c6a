"""The local-target tests use the shared fixtures of tests/conftest.py (`runtime_python`, `digits`)."""
