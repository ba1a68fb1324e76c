#!/usr/bin/env bash
# The VM's image recipe (run as root): vm/build-image.sh OUTDIR
# A Debian 12 root filesystem from Debian's packages, as an ext4 image, with the kernel and initrd
# from its /boot beside it. vm/harness.py caches OUTDIR under the hash of this file, so any edit
# here rebuilds. The guest's behaviour is not in the image: PID 1 hands over to vm/guest-init.sh.
set -euo pipefail

SUITE=bookworm
MIRROR=http://deb.debian.org/debian
PACKAGES=(linux-image-amd64 initramfs-tools kmod procps openvswitch-switch mininet iperf3 irtt prometheus
          ethtool iproute2 iputils-ping python3 python3-venv
          # what the project's venv (--system-site-packages) takes from Debian rather than PyPI, as
          # on the host (`.venv/bin/python -m pip check` is clean); debootstrap resolves no virtual
          # packages, hence python3-cffi-backend for python3-cryptography
          python3-yaml python3-openvswitch python3-pyparsing python3-sortedcontainers python3-six
          python3-requests python3-cryptography python3-cffi-backend)
IMAGE_SIZE=4G   # sparse; the guest writes into a throwaway overlay, never into this

out=$(realpath "$1")
mkdir -p "$out" "$out/../debs"
root=$(mktemp -d "$out/rootfs.XXXXXX")
cleanup() {
  # debootstrap mounts /proc, /sys, ... inside the target: if it stops halfway, unmount them
  # (deepest first) before removing the tree, and never cross into another filesystem.
  findmnt -rno TARGET | grep "^$root/" | sort -r | xargs -r -n1 umount -l || true
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "build-image: debootstrap $SUITE (${#PACKAGES[@]} packages and their dependencies)"
debootstrap --foreign --variant=minbase --cache-dir="$(realpath "$out/../debs")" \
  --include="$(IFS=,; echo "${PACKAGES[*]}")" "$SUITE" "$root" "$MIRROR"
# Packages' maintainer scripts would start their daemons (ovs-vswitchd, prometheus) on the build
# host, since a chroot shares its kernel and network: policy-rc.d forbids it.
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"
chroot "$root" /debootstrap/debootstrap --second-stage

echo "build-image: configuring"
# A small initrd with just what finds the root disk: it is unpacked under emulation at every boot.
sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
printf '%s\n' virtio_pci virtio_blk ext4 >> "$root/etc/initramfs-tools/modules"
chroot "$root" update-initramfs -u -k all
echo ovsqos-vm > "$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 ovsqos-vm\n' > "$root/etc/hosts"
cat > "$root/sbin/ovsqos-init" <<'INIT'
#!/bin/sh
# PID 1: mount the harness's control share and run the guest init the harness put there, so
# changing what the guest does needs no image rebuild. The initramfs already moved /proc, /sys,
# /dev and /run here; the checks keep this working if it ever does not.
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mountpoint -q /run || mount -t tmpfs tmpfs /run
modprobe -a 9pnet_virtio 9p
mkdir -p /run/ovsqos
mount -t 9p -o trans=virtio,version=9p2000.L ovsqos /run/ovsqos
exec /bin/bash /run/ovsqos/guest-init.sh
INIT
chmod +x "$root/sbin/ovsqos-init"
chroot "$root" apt-get clean
rm -f "$root/usr/sbin/policy-rc.d"

kernel=$(basename "$(ls "$root"/boot/vmlinuz-*)")
cp "$root/boot/$kernel" "$out/vmlinuz"
cp "$root/boot/initrd.img-${kernel#vmlinuz-}" "$out/initrd.img"
echo "${kernel#vmlinuz-}" > "$out/kernel-release"
echo "build-image: writing the ext4 image"
mkfs.ext4 -q -F -L ovsqos-root -d "$root" "$out/rootfs.img" "$IMAGE_SIZE"
echo "build-image: done"
