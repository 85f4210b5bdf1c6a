"""The image layers' byte-code (devkit.node.layers): valid where every file's mtime is 0."""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

from devkit.node import layers
from tests.bytecode import import_script


def _site(root: Path) -> Path:
    """A package as pip leaves it: sources and timestamp-based byte-code (pip's default)."""
    site = root / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("")
    (site / "pkg" / "mod.py").write_text("ANSWER = 42\n\ndef f():\n    return ANSWER\n")
    for src in (site / "pkg").glob("*.py"):
        py_compile.compile(str(src), invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP, doraise=True)
    return site


def _as_in_a_layer(site: Path, pycs: Path | None, dest: Path) -> Path:
    """``site`` copied as a layer holds it: every mtime 0, and ``pycs`` (when given) in place of
    pip's byte-code."""
    shutil.copytree(site, dest, ignore=shutil.ignore_patterns("__pycache__") if pycs else None)
    if pycs:
        shutil.copytree(pycs, dest, dirs_exist_ok=True)
    for p in dest.rglob("*"):
        os.utime(p, (0, 0))
    return dest


def _import(path: Path) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(path), PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPYCACHEPREFIX", None)
    script = import_script("import pkg.mod", '{"answer": pkg.mod.ANSWER, "file": pkg.mod.f.__code__.co_filename}')
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True).stdout
    result: dict[str, object] = json.loads(out)
    return result


def test_pips_byte_code_is_compiled_again_in_a_layer_and_the_hash_based_copy_is_not(tmp_path: Path) -> None:
    site = _site(tmp_path)
    stale = _import(_as_in_a_layer(site, None, tmp_path / "pip"))
    assert stale["compiled"] == [str(tmp_path / "pip" / "pkg" / n) for n in ("__init__.py", "mod.py")], stale

    written = layers.hash_based_pycs(site, tmp_path / "pycs")
    assert written == [Path("pkg/__pycache__"), Path(f"pkg/__pycache__/__init__{layers.PYC_SUFFIX}"),
                       Path(f"pkg/__pycache__/mod{layers.PYC_SUFFIX}")]
    for rel in written[1:]:  # pip's byte-code after a PEP 552 header: unchecked hash-based
        new, old = (tmp_path / "pycs" / rel).read_bytes(), (site / rel).read_bytes()
        assert new[4:8] == (1).to_bytes(4, "little") and new[16:] == old[16:] and new[:4] == old[:4]
    layer = _as_in_a_layer(site, tmp_path / "pycs", tmp_path / "layer")
    loaded = _import(layer)
    # no module compiled; the code names the file it was loaded from, not the one pip compiled
    assert (loaded["compiled"], loaded["answer"], loaded["file"]) == ([], 42, str(layer / "pkg" / "mod.py")), loaded
    # the same bytes from the same environment: a layer made again has the same digest
    assert layers.hash_based_pycs(site, tmp_path / "again") == written
    assert all((tmp_path / "again" / r).read_bytes() == (tmp_path / "pycs" / r).read_bytes() for r in written[1:])
