"""leftovers(), which every "nothing left behind" check reads, fails when it cannot look: with OVS down,
an empty list of bridges would prove nothing."""
import os
import stat

import pytest

from tests.integration import conftest


def test_leftovers_raises_when_ovs_vsctl_fails(tmp_path, monkeypatch):
    fake = tmp_path / "ovs-vsctl"
    fake.write_text("#!/bin/sh\necho 'ovs-vsctl: unix:/var/run/openvswitch/db.sock: database connection failed' >&2\n"
                    "exit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(RuntimeError, match="database connection failed"):
        conftest.leftovers()


def test_leftovers_reads_what_ovs_vsctl_says(tmp_path, monkeypatch):
    fake = tmp_path / "ovs-vsctl"
    fake.write_text("#!/bin/sh\ncase \"$*\" in *list-br*) echo left-behind-br ;; esac\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert conftest.leftovers()["bridges"] == "left-behind-br"
