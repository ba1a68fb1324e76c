"""controller/adapters/config.py: the [qos] options and the framework's OpenFlow TLS options, checked
before anything starts, one line naming the option."""
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller.adapters.config import COORDINATION, OPTIONS, ConfigError, settings


def conf(tmp_path: Path, default: dict | None = None, coordination: dict | None = None, **qos) -> SimpleNamespace:
    values = {o.name: o.default for o in OPTIONS} | qos
    framework = {"ofp_listen_host": "127.0.0.1", "ofp_tcp_listen_port": 6653, "ofp_ssl_listen_port": None,
                 "ctl_privkey": None, "ctl_cert": None, "ca_certs": None} | (default or {})
    return SimpleNamespace(qos=SimpleNamespace(**values), **framework, coordination=SimpleNamespace(
        **{o.name: o.default for o in COORDINATION} | (coordination or {})))


@pytest.fixture
def pem(tmp_path):
    for name in ("key.pem", "cert.pem", "ca.pem"):
        (tmp_path / name).write_text("PEM")
    return lambda name: str(tmp_path / name)


def refusal(config) -> str:
    with pytest.raises(ConfigError) as err:
        settings(config)
    return str(err.value)


def test_plain_tcp_openflow_and_a_unix_ovsdb_need_no_certificates(tmp_path):
    s = settings(conf(tmp_path))
    assert s.openflow == ("127.0.0.1", 6653) and s.ovsdb_ssl is None


def test_openflow_over_tls_listens_on_the_ssl_port_with_switch_certificates_checked(tmp_path, pem):
    tls = {"ctl_privkey": pem("key.pem"), "ctl_cert": pem("cert.pem"), "ca_certs": pem("ca.pem"),
           "ofp_ssl_listen_port": 6653, "ofp_tcp_listen_port": None}
    assert settings(conf(tmp_path, tls)).openflow == ("127.0.0.1", 6653)
    assert refusal(conf(tmp_path, {**tls, "ca_certs": None})).startswith("[DEFAULT] ca_certs: OpenFlow over TLS needs")
    assert refusal(conf(tmp_path, {**tls, "ofp_ssl_listen_port": None})).startswith(
        "[DEFAULT] ofp_ssl_listen_port: required")
    assert refusal(conf(tmp_path, {**tls, "ctl_cert": str(tmp_path / "gone.pem")})) == (
        f"[DEFAULT] ctl_cert: cannot read {tmp_path / 'gone.pem'} (No such file or directory); check the path")
    os.mkfifo(tmp_path / "fifo.pem")
    for endless in ("/dev/zero", str(tmp_path / "fifo.pem")):   # read whole, they would never end
        assert refusal(conf(tmp_path, {**tls, "ctl_privkey": endless})) == (
            "[DEFAULT] ctl_privkey: not a regular file (a directory, FIFO or device); give the path of a file")


def test_an_ssl_ovsdb_remote_needs_its_key_certificate_and_ca(tmp_path, pem):
    ssl = {"ovsdb": "ssl:127.0.0.2:6640", "ovsdb_private_key": pem("key.pem"), "ovsdb_certificate": pem("cert.pem"),
           "ovsdb_ca_cert": pem("ca.pem")}
    assert settings(conf(tmp_path, **ssl)).ovsdb_ssl == tuple(Path(pem(n)) for n in ("key.pem", "cert.pem", "ca.pem"))
    assert refusal(conf(tmp_path, **{**ssl, "ovsdb_ca_cert": ""})).startswith(
        "[qos] ovsdb_ca_cert: required by the ssl: ovsdb remote")
    assert refusal(conf(tmp_path, **{**ssl, "ovsdb": "tcp:127.0.0.2:6640"})).startswith(
        "[qos] ovsdb_private_key: only for an ssl: ovsdb remote")


@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1"])
def test_an_api_token_too_short_to_resist_guessing_is_refused(tmp_path, host):
    assert refusal(conf(tmp_path, api_host=host, api_token="x")) == (
        "[qos] api_token: too short to resist guessing; use at least 16 printable characters, e.g. the output of: "
        "openssl rand -hex 16")
    assert settings(conf(tmp_path, api_host=host, api_token="0123456789abcdef")).api_token == "0123456789abcdef"


def test_by_default_the_state_file_is_in_the_users_state_directory_not_the_installed_services(tmp_path, monkeypatch):
    assert not settings(conf(tmp_path)).state_file.is_relative_to("/var/lib/ovs-qos-controller")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert settings(conf(tmp_path, owner="lab")).state_file == tmp_path / "home/.local/state/ovs-qos-controller/lab.json"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert settings(conf(tmp_path)).state_file == tmp_path / "xdg/ovs-qos-controller/default.json"
    monkeypatch.setenv("XDG_STATE_HOME", "relative")          # not absolute: ignored, as XDG says
    assert settings(conf(tmp_path)).state_file.parent == tmp_path / "home/.local/state/ovs-qos-controller"
    assert settings(conf(tmp_path, state_file="/var/lib/ovs-qos-controller/default.json")).state_file == Path(
        "/var/lib/ovs-qos-controller/default.json")          # what the installed service's config names


def test_without_coordination_the_controller_runs_alone(tmp_path):
    assert settings(conf(tmp_path)).coordination is None


def test_a_cluster_member_is_named_after_its_host_and_api_port_unless_named(tmp_path):
    member = settings(conf(tmp_path, coordination={"backend_url": "etcd3+http://127.0.0.1:2379"})).coordination
    assert member is not None and member.member.endswith("-8080") and member.lease == 6
    named = settings(conf(tmp_path, coordination={"backend_url": "etcd3+https://e:2379", "member": "m1",
                                                   "membership_timeout": 4})).coordination
    assert named is not None and (named.member, named.lease) == ("m1", 4)


@pytest.mark.parametrize("coordination, qos, message", [
    ({"backend_url": "http://127.0.0.1:2379"}, {}, "[coordination] backend_url: 'http://127.0.0.1:2379' is not"),
    ({"backend_url": "etcd3+http://e", "membership_timeout": 1}, {}, "[coordination] membership_timeout: 1 s"),
    ({"backend_url": "etcd3+http://e", "member": "a b"}, {}, "[coordination] member: 'a b' is not"),
    ({"backend_url": "etcd3+http://e"}, {"standby": True}, "[qos] standby: a member of a cluster needs no standby"),
    ({"backend_url": "etcd3+http://e"}, {"policy": "policies/reserve.yaml"},
     "[qos] policy: a member of a cluster ([coordination] backend_url) takes its policy from etcd"),
])
def test_a_bad_coordination_section_is_one_line_naming_the_option(tmp_path, coordination, qos, message):
    with pytest.raises(ConfigError) as err:
        settings(conf(tmp_path, coordination=coordination, **qos))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
