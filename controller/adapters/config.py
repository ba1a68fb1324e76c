"""The controller's own options: the [qos] section of its config file, validated into Settings, with
the framework's OpenFlow TLS options ([DEFAULT] ctl_privkey, ctl_cert, ca_certs, ofp_ssl_listen_port).

They are registered on the framework's CONF (controller/compat.py), the one osken-manager parses;
values are read, and checked, when the app starts, so a bad value stops it with one line naming
the option, before anything is touched.
"""
from __future__ import annotations

import ipaddress
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oslo_config import cfg

from controller.adapters.ovsdb import DEFAULT_DB
from controller.core.document import read_file
from controller.core.errors import PolicyError
from controller.core.policy import OVSDB_REMOTE

OPTIONS = [
    cfg.StrOpt("policy", default="", help="policy file (YAML) to apply at start; empty: the last one applied"),
    cfg.StrOpt("state_file", default="", help="where the policy in force is kept across restarts (default "
                                              "~/.local/state/ovs-qos-controller/<owner>.json, under $XDG_STATE_HOME "
                                              "if set; the installed service's config names its own); a standby "
                                              "pair keeps it in its first OVSDB and a cluster in etcd instead"),
    cfg.StrOpt("ovsdb", default=DEFAULT_DB, help="OVSDB remotes, comma-separated: unix:PATH, tcp:HOST:PORT or "
                                                 "ssl:HOST:PORT; a switch is managed through the one holding its "
                                                 "bridge"),
    cfg.StrOpt("ovsdb_private_key", default="", help="ssl: remotes: this controller's private key (PEM)"),
    cfg.StrOpt("ovsdb_certificate", default="", help="ssl: remotes: this controller's certificate (PEM)"),
    cfg.StrOpt("ovsdb_ca_cert", default="", help="ssl: remotes: the CA certificate the server's must be signed by"),
    cfg.StrOpt("owner", default="default", help="external_ids tag of this controller's QoS rows; "
                                                "one controller per owner"),
    cfg.BoolOpt("standby", default=False,
                help="true: while another controller of this owner holds the OVSDB lock (of the first remote), "
                     "wait as its standby, OpenFlow slave, instead of exiting; take over when the lock is free"),
    cfg.StrOpt("api_host", default="127.0.0.1"),
    cfg.IntOpt("api_port", default=8080),
    cfg.StrOpt("api_token", default="", secret=True,
               help="bearer token every REST method but GET needs; required when api_host is not loopback"),
    cfg.StrOpt("metrics_host", default="127.0.0.1"),
    cfg.IntOpt("metrics_port", default=9101),
]
MIN_TOKEN = 16
_OWNER = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class ConfigError(ValueError):
    """A config file the controller cannot start with; the message names the option."""


@dataclass(frozen=True)
class Settings:
    policy: Path | None
    state_file: Path
    ovsdb: tuple[str, ...]      # remotes
    owner: str
    api: tuple[str, int]
    api_token: str
    metrics: tuple[str, int]
    ovsdb_ssl: tuple[Path, Path, Path] | None = None   # private key, certificate, CA certificate
    standby: bool = False                               # wait as standby while another holds the lock
    openflow: tuple[str, int] = ("0.0.0.0", 6653)       # where switches connect (TLS when configured)
    coordination: CoordinationSettings | None = None    # a member of a cluster ([coordination])


# [coordination], as OpenStack services configure tooz: without backend_url the controller runs alone.
COORDINATION = [
    cfg.StrOpt("backend_url", default="", help="tooz URL of the etcd that members of this owner share, e.g. "
                                               "etcd3+http://127.0.0.1:2379 (etcd3+https:// with ?ca_cert=...); "
                                               "empty: no cluster"),
    cfg.IntOpt("membership_timeout", default=6, help="seconds a member's switches stay its own after it was last "
                                                     "heard from (its etcd lease); at least 2"),
    cfg.StrOpt("member", default="", help="this member's name in the cluster (default: HOSTNAME-API_PORT)"),
]


@dataclass(frozen=True)
class CoordinationSettings:
    url: str
    lease: int                  # seconds
    member: str


def register(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(OPTIONS, group="qos")
    conf.register_opts(COORDINATION, group="coordination")


def settings(conf: cfg.ConfigOpts) -> Settings:
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
    if values["api_token"] and (len(values["api_token"]) < MIN_TOKEN or not values["api_token"].isprintable()):
        raise ConfigError(f"[qos] api_token: too short to resist guessing; use at least {MIN_TOKEN} printable "
                          "characters, e.g. the output of: openssl rand -hex 16")
    if api == (values["metrics_host"], values["metrics_port"]):
        raise ConfigError("[qos] metrics_port: the same address as the REST API; give each its own port")
    remotes = _remotes(values["ovsdb"])
    return Settings(policy=Path(values["policy"]) if values["policy"] else None,
                    state_file=Path(values["state_file"]) if values["state_file"] else _default_state_file(owner),
                    ovsdb=remotes, owner=owner, api=api, api_token=values["api_token"],
                    metrics=(values["metrics_host"], values["metrics_port"]), ovsdb_ssl=_ovsdb_ssl(values, remotes),
                    standby=values["standby"],
                    openflow=_openflow(conf), coordination=_coordination(conf, api[1], values))


def _coordination(conf: cfg.ConfigOpts, api_port: int, qos: dict[str, Any]) -> CoordinationSettings | None:
    try:
        values = {o.name: getattr(conf.coordination, o.name) for o in COORDINATION}
    except cfg.Error as err:
        raise ConfigError(f"[coordination] {err}") from None
    url = values["backend_url"]
    if not url:
        return None
    if not url.startswith(("etcd3+http://", "etcd3+https://")):
        raise ConfigError(f"[coordination] backend_url: {url!r} is not an etcd3+http:// or etcd3+https:// URL; "
                          "give the etcd the members share, e.g. etcd3+http://127.0.0.1:2379")
    if values["membership_timeout"] < 2:
        raise ConfigError(f"[coordination] membership_timeout: {values['membership_timeout']} s is too short for "
                          "a member to refresh its lease in time; use 2 or more (6 is the default)")
    if qos["standby"]:
        raise ConfigError("[qos] standby: a member of a cluster needs no standby (every member is active); remove "
                          "standby, or remove [coordination] backend_url")
    if qos["policy"]:
        raise ConfigError("[qos] policy: a member of a cluster ([coordination] backend_url) takes its policy from "
                          "etcd, never a file; remove policy and PUT it to any member, or remove [coordination]")
    member = values["member"] or f"{socket.gethostname()}-{api_port}"
    if not _OWNER.match(member):
        raise ConfigError(f"[coordination] member: {member!r} is not 1-64 letters, digits, '_', '.' or '-'")
    return CoordinationSettings(url, values["membership_timeout"], member)


def _default_state_file(owner: str) -> Path:
    """In the user's state directory (XDG), as a user running the controller by hand expects and can write;
    never the installed service's /var/lib/ovs-qos-controller, whose config names its file."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "state"   # a relative one is ignored (XDG)
    return base / "ovs-qos-controller" / f"{owner}.json"


def _remotes(text: str) -> tuple[str, ...]:
    remotes = tuple(r.strip() for r in text.split(",") if r.strip())
    if not remotes:
        raise ConfigError(f"[qos] ovsdb: no remote; give e.g. {DEFAULT_DB}")
    for remote in remotes:
        if not OVSDB_REMOTE.match(remote):
            raise ConfigError(f"[qos] ovsdb: {remote!r} is not an OVSDB remote; write unix:PATH, tcp:HOST:PORT or "
                              "ssl:HOST:PORT, several separated by commas")
    if len(set(remotes)) != len(remotes):
        raise ConfigError("[qos] ovsdb: a remote is listed twice; list each once")
    return remotes


def _ovsdb_ssl(values: dict[str, Any], remotes: tuple[str, ...]) -> tuple[Path, Path, Path] | None:
    """The key, certificate and CA ssl: remotes need (one set for all: python-ovs keeps one): all three,
    readable, and only with such a remote."""
    names = ("ovsdb_private_key", "ovsdb_certificate", "ovsdb_ca_cert")
    given = [n for n in names if values[n]]
    if not any(r.startswith("ssl:") for r in remotes):
        if given:
            raise ConfigError(f"[qos] {given[0]}: only for an ssl: ovsdb remote (ovsdb is {values['ovsdb']}); "
                              "remove it or use ssl:HOST:PORT")
        return None
    for name in names:
        if not values[name]:
            raise ConfigError(f"[qos] {name}: required by the ssl: ovsdb remote; give a PEM file (ovs-pki makes them)")
        _readable(Path(values[name]), f"[qos] {name}")
    key, certificate, ca_cert = (Path(values[n]) for n in names)
    return key, certificate, ca_cert


def _openflow(conf: cfg.ConfigOpts) -> tuple[str, int]:
    """Where switches connect: plain TCP, or TLS with switches' certificates checked against ca_certs."""
    host = conf.ofp_listen_host or "0.0.0.0"
    tls = {"ctl_privkey": conf.ctl_privkey, "ctl_cert": conf.ctl_cert, "ca_certs": conf.ca_certs}
    if not any(tls.values()):
        return host, conf.ofp_tcp_listen_port or 6653
    for name, value in tls.items():
        if not value:
            raise ConfigError(f"[DEFAULT] {name}: OpenFlow over TLS needs ctl_privkey, ctl_cert and ca_certs (the "
                              "CA switches' certificates must be signed by); give a PEM file")
        _readable(Path(value), f"[DEFAULT] {name}")
    if not conf.ofp_ssl_listen_port:
        raise ConfigError("[DEFAULT] ofp_ssl_listen_port: required with OpenFlow over TLS (os-ken then listens "
                          "on it alone); e.g. 6653")
    return host, conf.ofp_ssl_listen_port


def _readable(path: Path, option: str) -> None:
    """A PEM file that can be read: a regular file, read no further than a policy may be (a device or a FIFO
    named by mistake would never end)."""
    try:
        read_file(path, option)
    except OSError as err:
        raise ConfigError(f"{option}: cannot read {path} ({err.strerror}); check the path") from None
    except PolicyError as err:
        raise ConfigError(str(err)) from None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
