#!/usr/bin/env bash
# The agent's container image, built with no container daemon and no registry: a Debian 12 root filesystem from
# mmdebstrap (apt variant + python3), the gpuwatch-agent wheel in a venv at /opt/gpuwatch made by the rootfs's own
# /usr/bin/python3, a non-root user (65532:65532, as deploy/kubernetes/daemonset.yaml runs it), packed by umoci.
#
#   sudo bash scripts/build-image.sh
#
# Writes, for version V (gpuwatch/__init__.py):
#   dist/gpuwatch-image/            an OCI image layout, tag V        (umoci unpack --image dist/gpuwatch-image:V ...)
#   dist/gpuwatch-image-V.tar       the same as one archive, for:
#       ctr -n k8s.io images import dist/gpuwatch-image-V.tar       (name docker.io/library/gpuwatch:V)
#       podman load -i dist/gpuwatch-image-V.tar  /  docker load -i dist/gpuwatch-image-V.tar
#       skopeo copy oci-archive:dist/gpuwatch-image-V.tar docker://REGISTRY/gpuwatch:V
#
# The wheel is dist/gpuwatch_agent-V-*.whl when present (scripts/check-wheel.sh builds it), else built here. Python
# dependencies are fetched on this host by its pip (its index, mirrors and proxy settings) for the rootfs's Python and
# glibc, then installed offline inside the rootfs: the chroot needs no network, DNS or pip configuration of its own.
# Debian packages come from the Debian mirrors this host's apt uses (deb.debian.org when it names none).
# SOURCE_DATE_EPOCH (default: the last commit's time) fixes every timestamp in the image.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

say() { printf '[build-image] %s\n' "$*"; }
die() {
    printf '[build-image] error: %s\n' "$*" >&2
    exit 1
}

SUITE=bookworm
IMAGE_UID=65532
IMAGE_GID=65532
IMAGE_NAME=gpuwatch
LAYOUT=dist/gpuwatch-image
# What the image needs beyond the apt variant (Essential:yes + apt): the interpreter; tzdata, whose /etc/localtime
# (Etc/UTC) APScheduler's tzlocal reads (without it every start warns); python3-venv to make the venv with the
# rootfs's own Python. python3-venv and what it pulls in (the pip and setuptools wheels, which need ca-certificates and
# so openssl) are purged once the wheels are in: the agent makes no outgoing TLS connection.
PACKAGES=python3,tzdata,python3-venv
BUILD_ONLY_PACKAGES="python3-venv python3.11-venv python3-pip-whl python3-setuptools-whl ca-certificates openssl"

[[ $EUID -eq 0 ]] || die "run as root: mmdebstrap's root mode and chroot need it (sudo bash scripts/build-image.sh)"
VERSION=$(sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' gpuwatch/__init__.py)
[[ -n $VERSION ]] || die "no __version__ = \"...\" line in gpuwatch/__init__.py"
ARCHIVE=dist/gpuwatch-image-$VERSION.tar
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
started=$(date +%s)

WORK=$(mktemp -d /tmp/gpuwatch-image.XXXXXX)
cleanup() {
    # Nothing is left mounted (mmdebstrap unmounts its own; the chroot steps below mount nothing); the rootfs goes.
    rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT
ROOTFS=$WORK/rootfs

say "1/7 host tools: mmdebstrap, umoci, python3 with venv"
missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v umoci >/dev/null || missing+=(umoci)
command -v python3 >/dev/null && python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3 python3-venv)
if ((${#missing[@]})); then
    say "    apt-get install ${missing[*]}"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } ||
        die "could not install ${missing[*]} with apt-get"
fi
python3 -m venv "$WORK/hostenv" || die "python3 -m venv failed on this host"
HOSTPIP=("$WORK/hostenv/bin/python" -m pip -q)

say "2/7 wheel for gpuwatch-agent $VERSION"
shopt -s nullglob
wheels=(dist/gpuwatch_agent-"$VERSION"-*.whl)
shopt -u nullglob
if ((${#wheels[@]} == 0)); then
    say "    none in dist/: python -m build --wheel -o dist ."
    "${HOSTPIP[@]}" install build || die "pip could not install 'build' on this host"
    "$WORK/hostenv/bin/python" -m build --wheel -o dist . >"$WORK/build.log" 2>&1 ||
        die "the wheel build failed: $(tail -5 "$WORK/build.log")"
    wheels=(dist/gpuwatch_agent-"$VERSION"-*.whl)
fi
WHEEL=${wheels[0]}
say "    $WHEEL"

# The merged-usr hook makes the /usr symlinks itself and installs usr-is-merged, so init-system-helpers' dependency
# does not pull in usrmerge and a full perl (50 MiB).
say "3/7 Debian $SUITE root filesystem (mmdebstrap, variant apt, + ${PACKAGES//,/ })"
# The host's Debian sources for this suite (and its -updates and -security), as apt itself resolved them.
sources() {
    # shellcheck disable=SC2016  # apt's own $(FIELD) placeholders
    apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 'Identifier: Packages' 'Origin: Debian' \
        2>/dev/null | awk -v s="$SUITE" '$2 ~ "^(" s "|" s "-updates|" s "-security)$"' | sort -u |
        awk '{uri_suite[$1 " " $2] = uri_suite[$1 " " $2] " " $3} END {for (k in uri_suite) print "deb " k uri_suite[k]}' |
        sort
}
mapfile -t mirrors < <(sources)
if ((${#mirrors[@]} == 0)); then
    apt-get update -qq >/dev/null 2>&1 || true
    mapfile -t mirrors < <(sources)
fi
if ((${#mirrors[@]} == 0)); then
    mirrors=("deb http://deb.debian.org/debian $SUITE main" "deb http://deb.debian.org/debian $SUITE-updates main"
        "deb http://deb.debian.org/debian-security $SUITE-security main")
    say "    this host's apt has no Debian $SUITE sources: using deb.debian.org"
fi
for m in "${mirrors[@]}"; do say "    $m"; done
# shellcheck disable=SC2016  # the hook's $1 is mmdebstrap's: the rootfs
mmdebstrap --mode=root --variant=apt --format=directory --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --customize-hook='rm -f "$1/etc/resolv.conf" "$1/etc/hostname"' \
    --quiet "$SUITE" "$ROOTFS" "${mirrors[@]}" 2>"$WORK/mmdebstrap.log" ||
    die "mmdebstrap failed: $(tail -5 "$WORK/mmdebstrap.log")"

say "4/7 venv /opt/gpuwatch with the rootfs's Python, gpuwatch-agent and its dependencies"
read -r PYVER GLIBC ARCH < <(chroot "$ROOTFS" /usr/bin/python3 -c \
    'import platform, sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}", platform.libc_ver()[1], platform.machine())')
say "    rootfs: Python $PYVER, glibc $GLIBC, $ARCH"
platforms=()
for ((minor = 5; minor <= ${GLIBC#*.}; minor++)); do platforms+=(--platform "manylinux_2_${minor}_$ARCH"); done
platforms+=(--platform "manylinux2014_$ARCH" --platform "manylinux2010_$ARCH" --platform "manylinux1_$ARCH")
mkdir "$ROOTFS/tmp/wheels"
cp "$WHEEL" "$ROOTFS/tmp/wheels/"
"${HOSTPIP[@]}" download --dest "$ROOTFS/tmp/wheels" --only-binary=:all: --implementation cp \
    --python-version "$PYVER" --abi "cp${PYVER/./}" "${platforms[@]}" "$WHEEL" >"$WORK/download.log" 2>&1 ||
    die "pip could not fetch the dependencies for Python $PYVER/glibc $GLIBC: $(tail -5 "$WORK/download.log")"
say "    $(cd "$ROOTFS/tmp/wheels" && echo *.whl)"
in_root() {
    chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
        SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" "$@"
}
in_root /usr/bin/python3 -m venv /opt/gpuwatch
# SOURCE_DATE_EPOCH makes the .pyc files hash-checked (py_compile's default then), so they stay valid whatever
# the files' timestamps, and the read-only root never needs a rewrite.
in_root /opt/gpuwatch/bin/python -m pip install -q --no-index --no-cache-dir --find-links /tmp/wheels \
    "gpuwatch-agent==$VERSION" >"$WORK/install.log" 2>&1 ||
    die "pip install inside the rootfs failed: $(tail -5 "$WORK/install.log")"
in_root /opt/gpuwatch/bin/python -m pip check >/dev/null || die "pip check: the venv's dependencies are inconsistent"
in_root /opt/gpuwatch/bin/python -m pip uninstall -q -y pip setuptools >/dev/null
# shellcheck disable=SC2086
in_root dpkg --purge $BUILD_ONLY_PACKAGES >"$WORK/purge.log" 2>&1 || die "dpkg --purge failed: $(tail -5 "$WORK/purge.log")"
in_root /opt/gpuwatch/bin/python -c 'import gpuwatch.cli.main, pynvml' || die "the venv cannot import gpuwatch"

say "5/7 user gpuwatch ($IMAGE_UID:$IMAGE_GID), state dir, cleanup"
grep -q ":$IMAGE_UID:" "$ROOTFS/etc/passwd" && die "uid $IMAGE_UID is taken in the rootfs"
echo "gpuwatch:x:$IMAGE_UID:$IMAGE_GID:gpuwatch agent:/var/lib/gpuwatch:/usr/sbin/nologin" >>"$ROOTFS/etc/passwd"
echo "gpuwatch:x:$IMAGE_GID:" >>"$ROOTFS/etc/group"
echo "gpuwatch:*:0:0:99999:7:::" >>"$ROOTFS/etc/shadow"
echo "gpuwatch:*::" >>"$ROOTFS/etc/gshadow"
# The default state dir, the agent's own (the agent refuses one writable by others); the DaemonSet mounts the host's
# over it. /etc/gpuwatch is where a config (the DaemonSet's ConfigMap) goes; without one the defaults apply.
install -d -m 0750 -o "$IMAGE_UID" -g "$IMAGE_GID" "$ROOTFS/var/lib/gpuwatch"
install -d -m 0755 "$ROOTFS/etc/gpuwatch"
rm -rf "$ROOTFS/tmp/wheels" "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/* "$ROOTFS"/var/cache/debconf/*-old \
    "$ROOTFS"/var/lib/dpkg/*-old "$ROOTFS"/var/log/* "$ROOTFS"/root/.cache "$ROOTFS"/tmp/* "$ROOTFS"/var/tmp/*
# Device nodes are the runtime's to make.
find "$ROOTFS/dev" -mindepth 1 -delete
: >"$ROOTFS/etc/machine-id"
find "$ROOTFS" -xdev -newermt "@$SOURCE_DATE_EPOCH" -print0 | xargs -0r touch --no-dereference --date="@$SOURCE_DATE_EPOCH"
ROOTFS_MIB=$(du -sm --apparent-size "$ROOTFS" | cut -f1)
say "    root filesystem: $ROOTFS_MIB MiB"

say "6/7 OCI image $LAYOUT:$VERSION (umoci)"
rm -rf "$LAYOUT" "$ARCHIVE"
mkdir -p dist
umoci init --layout "$LAYOUT"
umoci new --image "$LAYOUT:$VERSION"
umoci insert --image "$LAYOUT:$VERSION" --history.created "$CREATED" \
    --history.created_by "scripts/build-image.sh: mmdebstrap $SUITE ($PACKAGES), gpuwatch-agent $VERSION in /opt/gpuwatch" \
    "$ROOTFS" /
# The source label: GPUWATCH_IMAGE_SOURCE, else this checkout's origin remote when that is an https URL; none otherwise
# (the project names no canonical URL of its own).
source_url=${GPUWATCH_IMAGE_SOURCE:-$(git remote get-url origin 2>/dev/null || true)}
source_label=()
if [[ $source_url == https://* ]]; then
    source_label=(--config.label "org.opencontainers.image.source=$source_url")
fi
# A numeric user: kubelet can only enforce runAsNonRoot against a numeric image user.
umoci config --image "$LAYOUT:$VERSION" --created "$CREATED" --history.created "$CREATED" \
    --history.created_by "scripts/build-image.sh: config" --architecture "$(dpkg --print-architecture)" --os linux \
    --config.user "$IMAGE_UID:$IMAGE_GID" \
    --config.entrypoint /opt/gpuwatch/bin/gpuwatch --config.cmd run \
    --config.exposedports 9845/tcp --config.workingdir /var/lib/gpuwatch \
    --config.env PATH=/opt/gpuwatch/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.env PYTHONUNBUFFERED=1 \
    --config.env NVIDIA_DRIVER_CAPABILITIES=utility \
    --config.stopsignal SIGTERM \
    --config.label "org.opencontainers.image.title=gpuwatch" \
    --config.label "org.opencontainers.image.description=GPU fleet health agent: NVML and AMD SMI readings, Prometheus metrics" \
    --config.label "org.opencontainers.image.version=$VERSION" \
    "${source_label[@]}" \
    --config.label "org.opencontainers.image.licenses=Apache-2.0" \
    --config.label "org.opencontainers.image.created=$CREATED" \
    --config.label "org.opencontainers.image.base.name=debian:$SUITE"
umoci gc --layout "$LAYOUT"

say "7/7 archive $ARCHIVE"
# index.json keeps umoci's org.opencontainers.image.ref.name=VERSION (skopeo's oci-archive:FILE:VERSION) and gets
# io.containerd.image.name, the full name containerd (ctr import), podman load and Docker's containerd store name the
# image by; manifest.json is what docker load reads in the classic store. The same three files docker save writes.
python3 - "$LAYOUT" "$IMAGE_NAME" "$VERSION" <<'EOF'
import json, pathlib, sys

layout, name, version = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
index = json.loads((layout / "index.json").read_text())
(descriptor,) = [d for d in index["manifests"] if d.get("annotations", {}).get("org.opencontainers.image.ref.name") == version]
descriptor["annotations"]["io.containerd.image.name"] = f"docker.io/library/{name}:{version}"
(layout / "index.json").write_text(json.dumps(index, separators=(",", ":")))

def blob(digest: str) -> str:
    algorithm, hexdigest = digest.split(":")
    return f"blobs/{algorithm}/{hexdigest}"

manifest = json.loads((layout / blob(descriptor["digest"])).read_text())
docker = [{"Config": blob(manifest["config"]["digest"]), "RepoTags": [f"{name}:{version}"],
           "Layers": [blob(layer["digest"]) for layer in manifest["layers"]]}]
(layout / "manifest.json").write_text(json.dumps(docker, separators=(",", ":")))
EOF
touch --date="@$SOURCE_DATE_EPOCH" "$LAYOUT/index.json" "$LAYOUT/manifest.json"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner -C "$LAYOUT" \
    -cf "$ARCHIVE" oci-layout index.json manifest.json blobs
digest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$LAYOUT/index.json")
say "done in $(($(date +%s) - started)) s: $ARCHIVE ($(du -m "$ARCHIVE" | cut -f1) MiB; root filesystem $ROOTFS_MIB MiB)"
say "    image gpuwatch:$VERSION, manifest $digest, user $IMAGE_UID:$IMAGE_GID"
