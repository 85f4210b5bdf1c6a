"""Make git say what serves once an experiment decides: with the experiment's `gitWriteback`
enabled, commit on a branch the Endpoint's spec serving the winner — its `experiment` removed,
its `variant` the winner's (reconciler/experiment/specedit.py) — with git's plumbing on a
temporary index, as the rollback write-back does (reconciler/rollout/writeback.py): the user's
checkout is never touched."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from reconciler.experiment.controller import ExperimentState
from reconciler.experiment.specedit import serve_winner, winner_edit
from reconciler.load.loader import LoadResult
from reconciler.rollout.writeback import CHECKOUT, WritebackSite, write_back_at, write_edited
from specs import Endpoint

#: What the experiment controller calls once an experiment is decided (``on_decided``): it returns
#: the line for the state's ``writeback`` ("" when the experiment asks for nothing).
DecisionHook = Callable[[Endpoint, str, ExperimentState], str]


def winner_hook(result: LoadResult, site: WritebackSite = CHECKOUT) -> DecisionHook:
    """The write-back of a decided experiment's winner, for the Endpoints of ``result``, at
    ``site``. Never raises: the winner serves already (:func:`write_back_at`)."""

    def hook(endpoint: Endpoint, version: str, state: ExperimentState) -> str:
        experiment = endpoint.spec.experiment
        writeback = experiment.git_writeback if experiment is not None else None
        if writeback is None or not writeback.enabled or state.winner is None:
            return ""
        edit = winner_edit(endpoint, version, state)
        if edit.impossible is not None:
            return f"write-back skipped: {edit.impossible}"
        winner = state.arm(state.winner)
        origin = result.origins[("Endpoint", endpoint.name)]
        branch = writeback.branch_for(endpoint.name)
        message = (f"Serve arm {winner.name} of endpoint {endpoint.name}: its experiment decided\n\n{state.reason}\n\n"
                   f"version {winner.version}, variant {winner.variant}")
        return write_back_at(site, Path(origin.file).parent, branch, lambda folder, head: write_edited(
            folder, origin.file, lambda text: serve_winner(text, endpoint.name, edit.variant), branch, message, head=head))

    return hook
