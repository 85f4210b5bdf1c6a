"""Options that several `forgectl` commands share, declared once.

Typer has no option groups: a command's options are its function's parameters. The plain shared
options are therefore ``Annotated`` aliases (one declaration, reused as a parameter type). The
target flags (`--kubeconfig`, `--context`, `--namespace`, `--prometheus-url`) always travel
together, so a command takes them as one :class:`TargetFlags` value: :func:`with_target_flags`
gives Typer a signature with the four options in the place of that parameter, and hands the command the value built
from them. The flags' names, help, order and defaults are the same for every command.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer

PathsArg = Annotated[list[str] | None, typer.Argument(help="Spec files or folders (default: current folder).")]
SpecsOpt = Annotated[list[str] | None, typer.Option("--specs", help="Spec files or folders (default: current folder).")]
RevOpt = Annotated[str | None, typer.Option("--rev", help="Read the specs at this git revision instead of the working tree.")]
EnvOpt = Annotated[str | None, typer.Option("--env", "-e", help="Environment to use (default: the one marked default, else `local`).")]
EndpointArg = Annotated[str, typer.Argument(help="Endpoint name.")]

KubeconfigOpt = Annotated[str | None, typer.Option("--kubeconfig", help="Kubeconfig file (default $KUBECONFIG, then ~/.kube/config).")]
ContextOpt = Annotated[str | None, typer.Option("--context", help="Kubeconfig context (default: the current one).")]
NamespaceOpt = Annotated[str | None, typer.Option("--namespace", "-n", help="Namespace (default: the environment's).")]
PrometheusOpt = Annotated[str | None, typer.Option(
    "--prometheus-url", help="Prometheus the rollout gates query (default: the environment's `prometheus.url`), e.g. "
    "http://127.0.0.1:9090 through `kubectl port-forward` when forgectl runs outside the cluster.")]


@dataclass(frozen=True)
class TargetFlags:
    """kubectl-style overrides of where the environment's target is: all None means the
    environment's own settings (and $KUBECONFIG / ~/.kube/config for a cluster)."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    #: The Prometheus to measure with, when the environment's in-cluster address is not reachable
    #: from where forgectl runs.
    prometheus_url: str | None = None


#: No flags given: the environment's own settings. (The default of a command's ``TargetFlags``
#: parameter; Typer never uses it, the options' own defaults build the value.)
NO_OVERRIDES = TargetFlags()


#: The parameters :func:`with_target_flags` puts in place of the ``TargetFlags`` one, in order.
_FLAG_PARAMETERS = (
    inspect.Parameter("kubeconfig", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=KubeconfigOpt),
    inspect.Parameter("context", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ContextOpt),
    inspect.Parameter("namespace", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=NamespaceOpt),
    inspect.Parameter("prometheus_url", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=PrometheusOpt),
)

F = TypeVar("F", bound=Callable[..., Any])


def with_target_flags(command: F) -> F:
    """Let ``command`` take the target flags as one parameter annotated :class:`TargetFlags`.

    Apply it below ``@app.command()``. Typer reads the returned function's ``__signature__``
    (``inspect.signature`` stops at it), where the ``TargetFlags`` parameter is replaced by the
    four options; Typer calls the command with keyword arguments only, so the wrapper takes them
    all by name and passes the rest on unchanged."""
    signature = inspect.signature(command, eval_str=True)
    names = [name for name, p in signature.parameters.items() if p.annotation is TargetFlags]
    if len(names) != 1:
        raise TypeError(f"{command.__qualname__}: with_target_flags needs exactly one parameter annotated TargetFlags")
    [group] = names
    taken = {p.name for p in _FLAG_PARAMETERS} & set(signature.parameters)
    if taken:
        raise TypeError(f"{command.__qualname__}: parameter(s) {sorted(taken)} clash with the target flags")
    parameters: list[inspect.Parameter] = []
    for name, parameter in signature.parameters.items():
        if name == group:
            parameters.extend(_FLAG_PARAMETERS)
        else:
            # keyword-only throughout: the flags are keyword-only and must not precede a
            # positional-or-keyword parameter; Typer passes every value by name anyway
            parameters.append(parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY))

    @functools.wraps(command)
    def wrapper(**values: Any) -> Any:
        flags = TargetFlags(values.pop("kubeconfig", None), values.pop("context", None), values.pop("namespace", None),
                            values.pop("prometheus_url", None))
        return command(**values, **{group: flags})

    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]  # read by inspect.signature
    return wrapper  # type: ignore[return-value]  # same call by name, flags spelled out
