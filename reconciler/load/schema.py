"""The committed `schema/` folder: the JSON Schema generated from specs/ (:mod:`specs.schemagen`,
pure) written there, and checked against it — `forgectl schema --write` / `--check`, and CI, which
fails when the committed files are stale."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specs.schemagen import dumps, schemas

#: The file that covers every kind (`forgectl schema` prints it).
ANY_DOCUMENT = "forge.schema.json"


@dataclass(frozen=True)
class SchemaCheck:
    """How the files in a schema folder compare with what specs/ generates."""

    generated: int
    #: Generated files missing from the folder or differing from what is generated.
    stale: tuple[Path, ...]
    #: `*.schema.json` files in the folder that specs/ does not generate.
    extra: tuple[Path, ...]

    @property
    def current(self) -> bool:
        """Whether the folder holds exactly what specs/ generates."""
        return not self.stale and not self.extra


def generated() -> dict[str, str]:
    """File name → text of every schema file specs/ generates."""
    return {name: dumps(schema) for name, schema in schemas().items()}


def check(directory: Path) -> SchemaCheck:
    """Compare ``directory`` with what specs/ generates (read only)."""
    files = generated()
    stale = tuple(directory / name for name, text in files.items()
                  if not (directory / name).is_file() or (directory / name).read_text() != text)
    extra = tuple(sorted(p for p in directory.glob("*.schema.json") if p.name not in files))
    return SchemaCheck(len(files), stale, extra)


def write(directory: Path) -> int:
    """Write every generated schema file into ``directory`` (created when missing); how many."""
    files = generated()
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return len(files)
