"""Up-front checks of ``kallot agent run``'s flags, before anything is started.

Each bad flag is one ``ConfigError`` naming the flag, the value and what was expected (the CLI
prints it and exits 2) instead of a traceback from deep inside a client library: a kubeconfig
that is missing or not a kubeconfig, a device-plugin directory that does not exist, a metrics
address without a port or whose port is taken, and ``--sharing`` / ``--replicas`` given while
the inventory file sets the modes itself (the file would win silently).
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import yaml

from kallot.config.files import read_text
from kallot.core.errors import ConfigError
from kallot.node.exporter import parse_address


def metrics_address(address: str) -> tuple[str, int]:
    """``host:port`` (port 0 = any free port) -> (host, port); the port must be free."""
    host, port = parse_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            why = "in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise ConfigError(
                "--metrics-address", address, f"an address this node can listen on ({why})"
            ) from None
    return host, port


def plugin_dir(path: Path) -> None:
    """The kubelet's device-plugin directory must exist (the kubelet creates it)."""
    if not path.is_dir():
        what = "not a directory" if path.exists() else "missing"
        raise ConfigError(
            "--device-plugin-dir", str(path), f"the kubelet's device-plugins directory ({what})"
        )


def kubeconfig(path: Path) -> None:
    """A kubeconfig file: readable YAML with clusters, users and contexts."""
    try:
        data = yaml.safe_load(read_text(path, "--kubeconfig"))
    except yaml.YAMLError as exc:
        line = str(exc).splitlines()[0]
        raise ConfigError("--kubeconfig", str(path), f"a valid kubeconfig ({line})") from None
    if not isinstance(data, dict):
        raise ConfigError("--kubeconfig", str(path), "a valid kubeconfig (not a YAML mapping)")
    missing = [k for k in ("clusters", "users", "contexts") if not data.get(k)]
    if missing:
        raise ConfigError(
            "--kubeconfig", str(path), f"a valid kubeconfig (no {', '.join(missing)})"
        )


def sharing_flags(
    *, file_sets_sharing: bool, sharing: str, replicas: int, default: tuple[str, int]
) -> None:
    """``--sharing`` / ``--replicas`` cannot apply when the inventory file sets the modes."""
    if not file_sets_sharing:
        return
    for flag, value, dflt in (
        ("--sharing", sharing, default[0]),
        ("--replicas", replicas, default[1]),
    ):
        if value != dflt:
            raise ConfigError(
                flag,
                value,
                "not set together with an --inventory-file that has a sharing section "
                "(the file's sharing applies; change it there)",
            )


def check_run(
    *,
    inventory_file: Path | None,
    sharing: str,
    replicas: int,
    device_plugin_dir: Path | None,
    metrics_address_: str,
    kubeconfig_: Path | None,
) -> None:
    """Every check ``kallot agent run`` makes before it starts (``None``: that part is off)."""
    if inventory_file is not None:
        from kallot.node.fake import load_inventory_file

        spec = load_inventory_file(inventory_file)  # a bad file: one line naming it
        sharing_flags(
            file_sets_sharing="sharing" in spec.model_fields_set,
            sharing=sharing,
            replicas=replicas,
            default=("mps", 1),
        )
    if device_plugin_dir is not None:
        plugin_dir(device_plugin_dir)
    metrics_address(metrics_address_)
    if kubeconfig_ is not None:
        kubeconfig(kubeconfig_)
