"""Offline policy checker, like Faucet's check_faucet_config:

    python3 -m controller.check [--ovsdb REMOTE] [--json] [--any-network] POLICY...

Validates each file (its bases resolved) and prints its normalised policy (controller/core/normalised.py),
one YAML document per file, then exits 0. On the first error it prints one line, `error: <file>: <message>`,
to stderr and exits 2, having printed nothing else. With --ovsdb it also checks every policy against that
OVSDB's bridges (controller/core/bridges.py), read in one select-only transaction.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from typing import TypeVar, TypeVarTuple

import yaml

from controller.core.bridges import OVSDB_READ, bridge_ports, check_bridges
from controller.core.errors import PolicyError
from controller.core.normalised import HexNumber, normalised_document
from controller.core.policy import Policy, for_any_network, load_document, parse_policy

T = TypeVar("T")
Args = TypeVarTuple("Args")
EXIT_ERROR = 2
OVSDB_TIMEOUT = 10.0


class _Dumper(yaml.SafeDumper):
    """dp_id and eth_type in hex, as OpenFlow tools print them."""


_Dumper.add_representer(HexNumber, lambda dumper, n: dumper.represent_scalar("tag:yaml.org,2002:int", n.hex()))


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        policies = [(path, _check_file(path, args.any_network)) for path in args.policies]
        if args.ovsdb:
            bridges = read_bridges(args.ovsdb)
            for path, policy in policies:
                _in_file(path, check_bridges, policy, bridges)
    except PolicyError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    for path, policy in policies:
        print(render(path, policy, args.json), end="")
    return 0


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m controller.check",
                                     description="Validate policy files and print them normalised; exit 2 on the "
                                                 "first error.")
    parser.add_argument("policies", nargs="+", metavar="POLICY", help="a policy file (YAML)")
    parser.add_argument("--ovsdb", metavar="REMOTE",
                        help="also check dp_ids and ports against this OVSDB's bridges (read only), "
                             "e.g. unix:/var/run/openvswitch/db.sock")
    parser.add_argument("--json", action="store_true",
                        help="print each policy as one line of JSON: the body PUT /qos/v1/policy takes")
    parser.add_argument("--any-network", action="store_true",
                        help="leave out the policy's switches: what it says for any network (its network: section)")
    return parser.parse_args(argv)


def _check_file(path: str, any_network: bool = False) -> Policy:
    document = load_document(path)   # its errors name the file already
    if any_network:
        document = _in_file(path, for_any_network, document)
    return _in_file(path, parse_policy, document)


def _in_file(path: str, check: Callable[[*Args], T], *args: *Args) -> T:
    """`check(*args)`, its PolicyError prefixed with the file it is about."""
    try:
        return check(*args)
    except PolicyError as err:
        raise PolicyError(f"{path}: {err}") from None


def render(path: str, policy: Policy, as_json: bool) -> str:
    document = normalised_document(policy)
    if as_json:
        return json.dumps(document) + "\n"
    return f"# {path}\n" + yaml.dump(document, Dumper=_Dumper, explicit_start=True, sort_keys=False,
                                     default_flow_style=None, allow_unicode=True, width=120)


def read_bridges(remote: str) -> dict[int, set[int]]:
    """{dp_id: OpenFlow port numbers} of every bridge, from one select-only (so read-only) transaction."""
    command = ["ovsdb-client", "transact", remote, json.dumps(OVSDB_READ)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=OVSDB_TIMEOUT, check=True)
        return bridge_ports(json.loads(done.stdout))
    except FileNotFoundError:
        reason = "ovsdb-client is not installed (Debian: openvswitch-common)"
    except subprocess.TimeoutExpired:
        reason = f"no answer within {OVSDB_TIMEOUT:g} s"
    except subprocess.CalledProcessError as err:
        reason = " ".join(err.stderr.split()) or f"ovsdb-client exited {err.returncode}"
    except (ValueError, KeyError, TypeError, IndexError) as err:
        reason = f"an answer this checker cannot read: {err}"
    raise PolicyError(f"--ovsdb {remote}: cannot read the bridges ({reason}); check that Open vSwitch runs and "
                      "the remote is right")


if __name__ == "__main__":
    sys.exit(main())
