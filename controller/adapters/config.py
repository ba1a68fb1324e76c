"""The controller's own options: the [qos] section of its config file, validated into Settings.

They are registered on the framework's CONF (controller/compat.py), the one osken-manager parses;
values are read, and checked, when the app starts, so a bad value stops it with one line naming
the option, before anything is touched.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from oslo_config import cfg

from controller.adapters.ovsdb import DEFAULT_DB

OPTIONS = [
    cfg.StrOpt("policy", default="", help="policy file (YAML) to apply at start; empty: the last one applied"),
    cfg.StrOpt("state_file", default="", help="where the policy in force is kept across restarts "
                                              "(default /var/lib/ovs-qos-controller/<owner>.json)"),
    cfg.StrOpt("ovsdb", default=DEFAULT_DB, help="OVSDB remote"),
    cfg.StrOpt("owner", default="default", help="external_ids tag of this controller's QoS rows; "
                                                "one controller per owner"),
    cfg.StrOpt("api_host", default="127.0.0.1"),
    cfg.IntOpt("api_port", default=8080),
    cfg.StrOpt("api_token", default="", secret=True,
               help="bearer token every REST method but GET needs; required when api_host is not loopback"),
    cfg.StrOpt("metrics_host", default="127.0.0.1"),
    cfg.IntOpt("metrics_port", default=9101),
]
STATE_DIR = Path("/var/lib/ovs-qos-controller")
_OWNER = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class ConfigError(ValueError):
    """A config file the controller cannot start with; the message names the option."""


@dataclass(frozen=True)
class Settings:
    policy: Path | None
    state_file: Path
    ovsdb: str
    owner: str
    api: tuple[str, int]
    api_token: str
    metrics: tuple[str, int]


def register(conf) -> None:
    conf.register_opts(OPTIONS, group="qos")


def settings(conf) -> Settings:
    try:
        qos = conf.qos
        values = {o.name: getattr(qos, o.name) for o in OPTIONS}
    except cfg.Error as err:
        raise ConfigError(f"[qos] {err}") from None
    owner = values["owner"]
    if not _OWNER.match(owner):
        raise ConfigError(f"[qos] owner: {owner!r} is not 1-64 letters, digits, '_', '.' or '-'")
    for name in ("api_port", "metrics_port"):
        if not 1 <= values[name] <= 65535:
            raise ConfigError(f"[qos] {name}: {values[name]} is not a TCP port (1-65535)")
    api = (values["api_host"], values["api_port"])
    if not values["api_token"] and not _loopback(api[0]):
        raise ConfigError(f"[qos] api_token: required because api_host {api[0]} is not loopback; set a long random "
                          "token, or listen on 127.0.0.1")
    if api == (values["metrics_host"], values["metrics_port"]):
        raise ConfigError("[qos] metrics_port: the same address as the REST API; give each its own port")
    return Settings(policy=Path(values["policy"]) if values["policy"] else None,
                    state_file=Path(values["state_file"]) if values["state_file"] else STATE_DIR / f"{owner}.json",
                    ovsdb=values["ovsdb"], owner=owner, api=api, api_token=values["api_token"],
                    metrics=(values["metrics_host"], values["metrics_port"]))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
