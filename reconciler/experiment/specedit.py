"""The edit that makes an Endpoint's spec serve an experiment's winner (pure): its `experiment`
removed and its `variant` set to the winner's, every other byte of the file as it was — comments,
other documents, key order — so the write-back's commit reads as the one line a person would
change. Positions come from PyYAML's own node marks; nothing is re-serialised."""

from __future__ import annotations

from dataclasses import dataclass

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from reconciler.experiment.controller import ExperimentState
from specs import Endpoint


@dataclass(frozen=True)
class WinnerEdit:
    """What the Endpoint's spec must say to serve its experiment's winner: `experiment` removed and
    ``variant`` set (None: the Endpoint's own is the winner's) — or, ``impossible``, why no spec
    can say it (the winner's version is not the one the specs build)."""

    variant: str | None = None
    impossible: str | None = None

    def describe(self) -> str:
        """The edit in words, for the plan's note."""
        if self.impossible is not None:
            return self.impossible
        return f"replace `experiment` with `variant: {self.variant}`" if self.variant else "remove `experiment`"


def winner_edit(endpoint: Endpoint, version: str, state: ExperimentState) -> WinnerEdit:
    """The edit that makes ``endpoint``'s spec serve the winner of its decided experiment (the
    specs build ``version``); the plan's note and the write-back both ask it."""
    winner = state.arm(state.winner or state.control)
    if winner.version != version:
        return WinnerEdit(impossible=f"the winner serves version {winner.version}, not the one the specs build "
                                     f"({version}): no Endpoint spec names it without the experiment")
    return WinnerEdit(winner.variant if winner.variant != endpoint.spec.variant else None)


class NotEditable(ValueError):
    """The file holds no Endpoint of that name with a block-style `spec.experiment` to remove."""


def serve_winner(text: str, endpoint: str, variant: str | None) -> str:
    """``text`` (a YAML file) with the `experiment` of Endpoint ``endpoint`` removed and, unless
    ``variant`` is None, its `variant` set to it: the value of an existing `variant` key replaced,
    else a `variant:` line put where `experiment` was. Raises :class:`NotEditable` otherwise."""
    spec = _spec_of(text, endpoint)
    pairs = {key.value: (key, value) for key, value in spec.value if isinstance(key, ScalarNode)}
    if "experiment" not in pairs:
        raise NotEditable(f"Endpoint {endpoint!r} has no `spec.experiment`")
    key, value = pairs["experiment"]
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    first, last = key.start_mark.line, _last_line(value)
    if text[starts[first]:key.start_mark.index].strip():
        raise NotEditable(f"Endpoint {endpoint!r}: `experiment` does not begin its own line")
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) by character index
    put = ""
    if variant is not None:
        if "variant" in pairs:
            old = pairs["variant"][1]
            edits.append((old.start_mark.index, old.end_mark.index, variant))
        else:
            put = " " * key.start_mark.column + f"variant: {variant}\n"
    edits.append((starts[first], starts[min(last + 1, len(lines))], put))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _spec_of(text: str, endpoint: str) -> MappingNode:
    """The block mapping `spec` of the Endpoint document named ``endpoint``."""
    for doc in yaml.compose_all(text, Loader=yaml.SafeLoader):
        if not isinstance(doc, MappingNode):
            continue
        top = {k.value: v for k, v in doc.value if isinstance(k, ScalarNode)}
        kind, metadata, spec = top.get("kind"), top.get("metadata"), top.get("spec")
        name = next((v for k, v in metadata.value if isinstance(k, ScalarNode) and k.value == "name"), None) \
            if isinstance(metadata, MappingNode) else None
        if isinstance(kind, ScalarNode) and kind.value == "Endpoint" and isinstance(name, ScalarNode) and name.value == endpoint:
            if not isinstance(spec, MappingNode) or spec.flow_style:
                raise NotEditable(f"Endpoint {endpoint!r}: `spec` is not a block mapping")
            return spec
    raise NotEditable(f"no Endpoint named {endpoint!r} in the file")


def _last_line(node: Node) -> int:
    """The last line (0-based) holding any of ``node``'s text: a block collection's own end mark
    lies at the next key, past any comment between, so its last child decides."""
    if isinstance(node, (MappingNode, SequenceNode)) and not node.flow_style and node.value:
        last = node.value[-1]
        return _last_line(last[1] if isinstance(last, tuple) else last)
    end = node.end_mark
    # a block scalar (`|`, `>`) ends after its last line break: on the next line, column 0
    return end.line - 1 if end.column == 0 and end.line > node.start_mark.line else end.line
