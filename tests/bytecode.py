"""A script for a Python process that imports modules and prints, as one JSON line, which source
files it compiled on the way (``compiled``: none where every module's byte-code is valid) and the
CPU it took (``cpu_s``). The image layers' byte-code tests run it (tests/testcluster/test_layers.py
in a folder made like a layer, tests/cluster/test_runtime_node.py in a pod of the runtime image)."""

from __future__ import annotations


def import_script(imports: str, report: str = "{}") -> str:
    """The script: ``imports`` (an import statement) run with Python's compiling of sources
    counted; ``report`` (an expression giving a dict, evaluated after the imports) adds its keys."""
    return f"""\
import importlib._bootstrap_external as boot, json, resource
compiled = []
to_code = boot.SourceLoader.source_to_code
def counted(self, data, path, *, _optimize=-1):
    compiled.append(path)
    return to_code(self, data, path, _optimize=_optimize)
boot.SourceLoader.source_to_code = counted
{imports}
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"compiled": compiled, "cpu_s": usage.ru_utime + usage.ru_stime, **({report})}}))
"""
