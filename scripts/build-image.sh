#!/usr/bin/env bash
# The controller as a container image, as root (docs/container.md):
#
#   scripts/build-image.sh            build localhost/ovs-qos-controller:latest, or find it up to date
#
# Idempotent: installs podman, runc and debootstrap from Debian if missing; makes the Debian 12 base
# image once (debootstrap --variant=minbase into $OVSQOS_IMAGE_CACHE, default /var/cache/ovs-qos-image,
# then `podman import`: no registry is reachable here), tagged with the hash of its recipe, so later
# builds reuse it; then `podman build`s the Containerfile, whose layers podman caches: a build with
# nothing changed makes nothing new. Prints the image's size and the build's time.
# Podman runs with containers/containers.conf (runc, no default ulimits): export CONTAINERS_CONF as
# below to run the image by hand.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=localhost/ovs-qos-controller:latest
BASE_NAME=localhost/ovs-qos-controller-base
CACHE=${OVSQOS_IMAGE_CACHE:-/var/cache/ovs-qos-image}
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
HOST_PACKAGES=(podman runc debootstrap)
# What the image's venv (--system-site-packages) takes from Debian rather than PyPI, as .venv does on
# the host: OVS's Python bindings (ovsdbapp's `ovs`, matching the host's OVS) and PyYAML; python3-venv
# for the venv's pip; iproute2 for `tc` (the queue disciplines other than FIFOs); tini as PID 1.
BASE_PACKAGES=(python3 python3-venv python3-openvswitch python3-yaml iproute2 tini)
BASE_RECIPE=1   # raise when the base's making below changes: a new tag, a new base

export CONTAINERS_CONF=$PWD/containers/containers.conf
say() { echo "build-image: $*"; }
[ "$(id -u)" -eq 0 ] || { echo "build-image: run as root (apt, debootstrap and podman need it)" >&2; exit 2; }
start=$SECONDS

missing=()
for p in "${HOST_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$CACHE/debs"
exec 9>"$CACHE/.lock"
flock 9   # one build at a time: two would debootstrap into one cache and tag one image

key=$( (echo "$SUITE $MIRROR $BASE_RECIPE"; printf '%s\n' "${BASE_PACKAGES[@]}") | sha256sum | cut -c1-12)
BASE=$BASE_NAME:$key
if podman image exists "$BASE"; then
  say "base $BASE is there"
else
  say "making the base $BASE: debootstrap $SUITE minbase with ${BASE_PACKAGES[*]}"
  root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  cleanup() {
    # debootstrap mounts /proc and /sys inside the target: unmount them (deepest first) before removing
    # the tree, and never cross into another filesystem.
    findmnt -rno TARGET | grep "^$root/" | sort -r | xargs -r -n1 umount -l || true
    rm -rf --one-file-system "$root" "$CACHE/base.tar"
  }
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  debootstrap --variant=minbase --cache-dir="$CACHE/debs" --include="$(IFS=,; echo "${BASE_PACKAGES[*]}")" \
    "$SUITE" "$root" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
  findmnt -rno TARGET | grep "^$root/" | sort -r | xargs -r -n1 umount -l || true
  # What a container never reads: apt's lists and caches, documentation, manual pages, translations.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
         "$root"/usr/share/locale/* "$root"/usr/share/info/* "$root"/var/log/*
  tar --numeric-owner -C "$root" -cf "$CACHE/base.tar" .
  podman import -q --change 'CMD ["/bin/bash"]' "$CACHE/base.tar" "$BASE" >/dev/null
  cleanup; trap - EXIT INT TERM
  # Bases of older recipes are of no more use.
  podman images --format '{{.Repository}}:{{.Tag}}' "$BASE_NAME" | grep -vx "$BASE" | xargs -r podman rmi -f >/dev/null || true
  say "base made in $((SECONDS - start)) s"
fi

# The build context: only what the Containerfile copies (no venvs, caches or results of the checkout).
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp -r Containerfile controller requirements policies "$ctx/"
mkdir "$ctx/scripts" && cp scripts/startup-hook.sh "$ctx/scripts/"
find "$ctx" -name __pycache__ -prune -exec rm -rf {} +
# pip in the build reaches PyPI as the host's pip does: with its config and CA bundle when it has them
# (here a proxy re-signs TLS with a CA of its own; without the host's bundle pip's fails the handshake).
# Mounted for the build only: they are in no layer.
mounts=()
for f in /etc/pip.conf /etc/ssl/certs/ca-certificates.crt; do
  [ -f "$f" ] && mounts+=(-v "$f:$f:ro")
done
old=$(podman image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
podman build -q --network host "${mounts[@]}" --build-arg "BASE=$BASE" -t "$IMAGE" -f "$ctx/Containerfile" "$ctx" >/dev/null
new=$(podman image inspect -f '{{.Id}}' "$IMAGE")
if [ -n "$old" ] && [ "$old" != "$new" ]; then
  podman rmi "$old" >/dev/null 2>&1 || true   # the last build's image, unless a container still uses it
fi
size=$(podman image inspect -f '{{.Size}}' "$IMAGE")
say "$IMAGE ${new:0:12}: $((size / 1000000)) MB, built in $((SECONDS - start)) s"
