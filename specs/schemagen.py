"""JSON Schema (draft 2020-12) of the Forge kinds, generated from the pydantic models.

Pure: returns dicts; `forgectl schema --write` stores them under `schema/`, and
`forgectl schema --check` fails when the committed files differ.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter

from specs.documents import KINDS, AnyDocument

DIALECT = "https://json-schema.org/draft/2020-12/schema"
BASE_ID = "https://forge.dev/schema/v1alpha1/"
GENERATED_NOTE = "Generated from specs/ by `forgectl schema --write`; do not edit by hand."


def _finish(schema: dict[str, Any], file_name: str, title: str) -> dict[str, Any]:
    return {"$schema": DIALECT, "$id": BASE_ID + file_name, "$comment": GENERATED_NOTE, "title": title, **schema}


def schemas() -> dict[str, dict[str, Any]]:
    """File name → schema: one per kind, and `forge.schema.json` for any Forge document."""
    out: dict[str, dict[str, Any]] = {}
    for kind, cls in KINDS.items():
        name = f"{kind.lower()}.schema.json"
        out[name] = _finish(cls.model_json_schema(by_alias=True, mode="validation"), name, f"Forge {kind}")
    any_doc = TypeAdapter(AnyDocument).json_schema(by_alias=True, mode="validation")
    out["forge.schema.json"] = _finish(any_doc, "forge.schema.json", "Any Forge document")
    return out


def dumps(schema: dict[str, Any]) -> str:
    """Stable text of a schema file (sorted keys, trailing newline) so diffs stay small."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
