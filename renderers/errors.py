"""What rendering refuses: specs that are valid one by one but cannot be made into objects that
would work (a model that fits no pool, a workspace smaller than one checkpoint)."""

from __future__ import annotations


class RenderError(ValueError):
    """Specs that cannot be rendered into working objects; the message names the numbers and the
    setting to change. The CLI prints it and exits 1."""
