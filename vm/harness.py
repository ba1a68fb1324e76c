"""Run topo/run.py in a Debian 12 VM with Debian's stock kernel:  python3 -m vm.harness [options] -- <run.py args>

For hosts whose kernel lacks what the studies need (the OVS kernel datapath, netem, RED/SFQ/CoDel,
most TCP congestion controls) and cannot load modules. The VM image is built once from Debian's
packages (vm/build-image.sh) and cached under /var/cache/ovs-qos-vm/<hash of the recipe>/. Each run
boots it on a throwaway overlay, shares the repository at the same absolute path over virtio-9p, and
runs `python3 topo/run.py <args>` there as root; results/ lands in the repository as usual.
The guest's output streams to stdout, the harness's own lines go to stderr, and the command's exit
code is the harness's (125 if the guest died without one, 128+N on signal N).
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VM_DIR = Path(__file__).resolve().parent
REPO = VM_DIR.parent
# The image cache; OVSQOS_VM_CACHE moves it (e.g. to a CI cache directory, or a fresh one to time a build).
CACHE = Path(os.environ.get("OVSQOS_VM_CACHE") or "/var/cache/ovs-qos-vm")
ENV_VAR = "OVSQOS_VM"  # the JSON the command sees in the guest; vm_environment() reads it
# A KVM guest's kernel prints its first console line within about a second. Where nested
# virtualisation is broken (vm/README.md) QEMU aborts (-cpu host) or the guest spins silently after
# the firmware, so either, before any console output, means TCG.
KVM_SILENCE_S = 10
BOOT_TIMEOUT_S = 600  # a TCG boot takes well under a minute (vm/README.md); longer is a hang
GUEST_DIED = 125


def vm_environment() -> dict:
    """What the harness recorded about the VM this process runs in ({} outside one):
    accelerator ("kvm" or "tcg"), kernel (the guest's release), vcpus, memory_mib."""
    return json.loads(os.environ.get(ENV_VAR, "{}"))


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class VMError(Exception):
    pass


def say(msg: str) -> None:
    print(f"vm: {msg}", file=sys.stderr, flush=True)


def _on_signal(signum: int, _frame) -> None:
    # One interrupt is enough: ignore more so that the cleanup it starts runs to the end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(signum)


def _stop(proc: subprocess.Popen) -> None:
    """End a child started in its own session, and everything it started."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)  # the build script unmounts and removes its half-built tree on TERM
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _remove(path: Path) -> None:
    # --one-file-system: a build killed outright may have left /proc or /sys mounted inside.
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def ensure_image(rebuild: bool) -> Path:
    """The cached image of the current recipe, built first if missing (or if rebuild)."""
    key = hashlib.sha256((VM_DIR / "build-image.sh").read_bytes()).hexdigest()[:16]
    image = CACHE / key
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent run waits for this build, then uses it
        if image.is_dir() and not rebuild:
            return image
        for old in CACHE.iterdir():  # images of older recipes, and builds cut short; debs/ is reused
            if old.is_dir() and old.name not in ("debs", key):
                _remove(old)
        partial, log = CACHE / f"{key}.partial", CACHE / "build.log"
        say(f"building the VM image {key} from Debian's packages (once; log: {log})")
        start = time.monotonic()
        with open(log, "w") as out:
            build = subprocess.Popen([str(VM_DIR / "build-image.sh"), str(partial)], stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = build.wait()
            finally:
                _stop(build)
                if build.returncode != 0:
                    _remove(partial)
        if rc != 0:
            tail = log.read_text(errors="replace").splitlines()[-15:]
            raise VMError(f"image build failed (exit {rc}):\n  " + "\n  ".join(tail))
        _remove(image)  # with --rebuild, the old image goes only once the new one is complete
        partial.rename(image)
        size = sum(f.stat().st_blocks * 512 for f in image.iterdir()) / 2**20
        say(f"image built in {time.monotonic() - start:.0f} s: {size:.0f} MiB on disk in {image}")
        return image


def shares() -> list[Path]:
    """The repository, and its venv when .venv is a link out of it (e.g. a clone sharing one)."""
    paths = [REPO]
    venv = (REPO / ".venv").resolve()
    if venv.is_dir() and not venv.is_relative_to(REPO):
        paths.append(venv)
    return paths


def qemu_argv(image: Path, accel: str, args: argparse.Namespace, tmp: Path) -> list[str]:
    cpu = ["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else ["-accel", "tcg,thread=multi", "-cpu", "max"]
    # mitigations=off: speculative-execution defences cost a lot under emulation and protect nothing
    # in a throwaway guest. edd=off: no firmware probe line before the kernel's own, so the first
    # console output means the kernel runs. panic=-1 + -no-reboot: a failed boot ends QEMU, never hangs.
    cmdline = "console=ttyS0 edd=off root=/dev/vda rw fastboot init=/sbin/ovsqos-init panic=-1 mitigations=off"
    argv = ["qemu-system-x86_64", *cpu, "-smp", str(args.cpus), "-m", str(args.memory),
            "-nodefaults", "-display", "none", "-no-reboot", "-nic", "none",
            "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"), "-append", cmdline,
            # snapshot=on: writes go to a temporary overlay (under TMPDIR), never to the cached image
            "-drive", f"file={image / 'rootfs.img'},format=raw,if=virtio,snapshot=on",
            "-chardev", f"file,id=console,path={tmp / 'console.log'}", "-serial", "chardev:console",
            "-chardev", "stdio,id=out,signal=off", "-serial", "chardev:out",
            "-virtfs", f"local,path={tmp / 'ctl'},mount_tag=ovsqos,security_model=none"]
    for i, path in enumerate(shares()):
        argv += ["-virtfs", f"local,path={path},mount_tag=share{i},security_model=none"]
    return argv


def write_env(ctl: Path, environment: dict, command: list[str], output: str) -> None:
    q = shlex.quote
    (ctl / "vm.env").write_text(
        f"OVSQOS_VM={q(json.dumps(environment))}\n"
        f"SHARES=({' '.join(q(f'share{i}:{p}') for i, p in enumerate(shares()))})\n"
        f"WORKDIR={q(str(REPO))}\n"
        f"COMMAND=({' '.join(map(q, command))})\n"
        f"OUTPUT={output}\n")


def boot(image: Path, accel: str, args: argparse.Namespace, tmp: Path, interactive: bool) -> int | None:
    """One VM run to its end: the command's exit code, or None if KVM does not work (try TCG)."""
    console = tmp / "console.log"
    console.write_bytes(b"")
    start = time.monotonic()
    qemu = subprocess.Popen(qemu_argv(image, accel, args, tmp), env={**os.environ, "TMPDIR": str(tmp)},
                            stdin=None if interactive else subprocess.DEVNULL, start_new_session=True)
    try:
        booted = None
        while True:
            exited, elapsed, log = qemu.poll() is not None, time.monotonic() - start, console.read_bytes()
            if accel == "kvm" and not log and (exited or elapsed > KVM_SILENCE_S):
                how = "QEMU failed" if exited else f"the guest printed nothing in {KVM_SILENCE_S} s"
                say(f"KVM does not work here: {how} before the kernel's first line (nested virtualisation?)")
                return None
            if exited:
                break
            if booted is None and b"ovsqos-vm: init" in log:
                booted = elapsed
            if b"ovsqos-vm: ready" in log:
                say(f"{accel}: kernel to init in {booted:.1f} s, ready (modules, 9p, OVS) in {elapsed:.1f} s")
                qemu.wait()
                break
            if elapsed > BOOT_TIMEOUT_S:
                raise VMError(f"the guest was not ready after {BOOT_TIMEOUT_S} s:\n{_tail(console)}")
            time.sleep(0.1)
    finally:
        _stop(qemu)
    rc = tmp / "ctl" / "rc"
    if not rc.exists():
        say(f"the guest ended without an exit code (QEMU exit {qemu.returncode}); console:\n{_tail(console)}")
        return GUEST_DIED
    return int(rc.read_text())


def _tail(console: Path) -> str:
    return "\n".join("  " + line for line in console.read_text(errors="replace").splitlines()[-20:])


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="vm", usage="%(prog)s [options] -- [topo/run.py arguments]",
                                description=__doc__.splitlines()[0])
    p.add_argument("--memory", type=int, default=2048, metavar="MiB", help="guest memory (default 2048)")
    p.add_argument("--cpus", type=int, default=2, help="guest vCPUs (default 2; TCG runs one host thread each)")
    p.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                   help="auto (default): KVM if /dev/kvm is there and its guest boots, else TCG emulation")
    p.add_argument("--rebuild", action="store_true", help="build the image again even if it is cached")
    p.add_argument("--shell", action="store_true", help="an interactive root shell in the guest instead")
    p.add_argument("--exec", action="store_true", help="run the arguments as a command, not as topo/run.py's")
    return p.parse_args(own), rest


def main(argv: list[str]) -> int:
    args, rest = parse_args(argv)
    if os.geteuid() != 0:
        say("run as root (debootstrap, and the guest's root shares files with the host as root)")
        return 2
    missing = [tool for tool in ("qemu-system-x86_64", "debootstrap", "mkfs.ext4") if not shutil.which(tool)]
    if missing:
        say(f"{', '.join(missing)} missing: run scripts/setup.sh (it installs qemu-system-x86 and debootstrap)")
        return 2
    command = ["bash", "-l"] if args.shell else rest if args.exec else ["python3", "topo/run.py", *rest]
    output = "shell" if args.shell else "tty" if sys.stdout.isatty() else "pipe"
    if args.accel == "auto":
        accels = ["kvm", "tcg"] if os.access("/dev/kvm", os.R_OK | os.W_OK) else ["tcg"]
    else:
        accels = [args.accel]
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        image = ensure_image(args.rebuild)
        with tempfile.TemporaryDirectory(prefix="ovsqos-vm-") as tmp:
            (Path(tmp) / "ctl").mkdir()
            shutil.copy(VM_DIR / "guest-init.sh", Path(tmp) / "ctl")
            for accel in accels:
                environment = {"accelerator": accel, "kernel": (image / "kernel-release").read_text().strip(),
                               "vcpus": args.cpus, "memory_mib": args.memory}
                write_env(Path(tmp) / "ctl", environment, command, output)
                say(f"{ENV_VAR}={json.dumps(environment)}")
                rc = boot(image, accel, args, Path(tmp), args.shell)
                if rc is not None:
                    return rc
                say("falling back to TCG")
            raise VMError("KVM was asked for (--accel kvm) and does not work here")
    except Interrupted as e:
        say(f"{e}: stopped what it started and removed its temporary files")
        return 128 + e.signum
    except VMError as e:
        say(f"error: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
