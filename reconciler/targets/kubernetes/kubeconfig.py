"""Reading a kubeconfig without surprises: bounded, parsed as YAML by us (so a file that is not a
mapping is one clear error with file:line), never written back, and — in pull-request mode — only
from the runner, never from the tree under review.

Loading a kubeconfig is not inert: the `kubernetes` client runs a user's `exec` plugin (any command)
and `auth-provider` helpers (`cmd-path`) while loading, and connects to whatever server the file
names. So in pull-request mode (`plan --base`) the kubeconfig path comes from `--kubeconfig`,
`$KUBECONFIG` or `~/.kube/config` only (never from an Environment spec), a file inside the
repository under review is refused, and an `exec`/`auth-provider` command given as a relative
path (which would resolve against the checkout) is refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.kube_config import KubeConfigLoader

from reconciler.diagnostics import printable
from reconciler.errors import TargetNotAvailable
from reconciler.load.sources import read_bounded

MAX_KUBECONFIG_BYTES = 1024 * 1024


def kubeconfig_path(explicit: str | None) -> Path:
    """`--kubeconfig`, else the first entry of `$KUBECONFIG`, else `~/.kube/config` (as kubectl)."""
    path = explicit or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or "~/.kube/config"
    return Path(path).expanduser()


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def read_kubeconfig(path: Path, *, untrusted_root: Path | None = None) -> dict[str, Any]:
    """The kubeconfig at ``path`` as a mapping, or a :class:`TargetNotAvailable` that says why not.
    With ``untrusted_root``, a file inside it (the repository under review) is refused."""
    where = printable(str(path))
    if untrusted_root is not None:
        try:
            real = path.resolve()
        except (OSError, RuntimeError):
            real = path.absolute()
        if _inside(real, untrusted_root.resolve()):
            raise TargetNotAvailable(
                f"kubeconfig {where} is inside the repository under review ({untrusted_root}); in pull-request "
                "mode credentials come only from the runner (`--kubeconfig` or $KUBECONFIG outside the checkout)"
            )
    source = read_bounded(path, where, Path(path.resolve().anchor), limit=MAX_KUBECONFIG_BYTES)
    if source.problem:
        raise TargetNotAvailable(f"kubeconfig {where}: {source.problem}")
    try:
        data = yaml.safe_load(source.data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise TargetNotAvailable(f"{where}:1:1: kubeconfig is not valid UTF-8") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise TargetNotAvailable(f"{where}:{line}:{col}: kubeconfig is not valid YAML: {exc.problem}") from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        raise TargetNotAvailable(f"{where}:1:1: kubeconfig is not valid YAML: {printable(str(exc))[:200]}") from None
    if not isinstance(data, dict):
        what = "a list" if isinstance(data, list) else "empty" if data is None else f"a {type(data).__name__}"
        raise TargetNotAvailable(
            f"{where}:1:1: not a kubeconfig: expected a mapping with `clusters`, `contexts` and `users`, got {what}"
        )
    for key in ("clusters", "contexts", "users"):
        value = data.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, dict) for v in value)):
            raise TargetNotAvailable(f"{where}: not a kubeconfig: `{key}` must be a list of mappings")
    return data


def _entry(items: Any, name: Any, key: str) -> dict[str, Any]:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(key), dict):
            return item[key]
    return {}


def check_untrusted_commands(data: dict[str, Any], context: str | None, where: str, untrusted_root: Path) -> None:
    """Refuse an `exec` plugin or `auth-provider` helper of the selected user that would run a
    command by a relative path (resolved against the checkout) or from inside ``untrusted_root``."""
    ctx = _entry(data.get("contexts"), context or data.get("current-context"), "context")
    user = _entry(data.get("users"), ctx.get("user"), "user")
    commands = []
    if isinstance(user.get("exec"), dict):
        commands.append(("exec plugin", user["exec"].get("command")))
    provider = user.get("auth-provider")
    if isinstance(provider, dict) and isinstance(provider.get("config"), dict) and "cmd-path" in provider["config"]:
        commands.append(("auth-provider cmd-path", provider["config"]["cmd-path"]))
    for what, command in commands:
        if not isinstance(command, str) or not command:
            raise TargetNotAvailable(f"kubeconfig {where}: the {what} has no command")
        if "/" in command and not os.path.isabs(command):
            raise TargetNotAvailable(f"kubeconfig {where}: the {what} runs {printable(command)!r}, a relative path; "
                                     "in pull-request mode it would resolve against the checkout under review")
        if os.path.isabs(command) and _inside(Path(command).resolve(), untrusted_root.resolve()):
            raise TargetNotAvailable(f"kubeconfig {where}: the {what} runs {printable(command)!r}, inside the "
                                     "repository under review")


#: In a pod: the ServiceAccount's token and the cluster's CA, mounted by the kubelet.
IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
IN_CLUSTER_CA = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")


def in_cluster() -> bool:
    """Whether this process runs in a pod with a ServiceAccount token, and nothing names a kubeconfig
    (no `--kubeconfig`, no $KUBECONFIG, no ~/.kube/config): then the pod's own credentials are used,
    as client-go's `rest.InClusterConfig` does (the in-cluster controller)."""
    return (not os.environ.get("KUBECONFIG") and not Path("~/.kube/config").expanduser().exists()
            and bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and IN_CLUSTER_TOKEN.is_file())


def load_client_config(explicit: str | None, context: str | None, *,
                       untrusted_root: Path | None = None) -> k8s.Configuration:
    """A client configuration from a kubeconfig (see module docstring), or, in a pod where nothing
    names one, from the pod's ServiceAccount (:func:`in_cluster`). Never writes the file back."""
    if explicit is None and context is None and untrusted_root is None and in_cluster():
        from kubernetes.config.incluster_config import InClusterConfigLoader

        cfg = k8s.Configuration()
        try:
            InClusterConfigLoader(token_filename=str(IN_CLUSTER_TOKEN), cert_filename=str(IN_CLUSTER_CA)).load_and_set(cfg)
        except (ConfigException, OSError, ValueError) as exc:
            raise TargetNotAvailable(f"cannot use the pod's ServiceAccount ({IN_CLUSTER_TOKEN}): "
                                     f"{printable(str(exc))[:300]}") from exc
        return cfg
    path = kubeconfig_path(explicit)
    data = read_kubeconfig(path, untrusted_root=untrusted_root)
    where = printable(str(path))
    if untrusted_root is not None:
        check_untrusted_commands(data, context, where, untrusted_root)
    cfg = k8s.Configuration()
    try:
        KubeConfigLoader(config_dict=data, active_context=context, config_base_path=str(path.parent),
                         config_persister=None).load_and_set(cfg)
    except (ConfigException, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        on = f"context {printable(context)!r} of " if context else ""
        raise TargetNotAvailable(f"cannot load {on}kubeconfig {where}: {printable(str(exc))[:300]}") from exc
    return cfg
