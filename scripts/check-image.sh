#!/usr/bin/env bash
# Builds the container image (scripts/build-image.sh) and runs it with no container daemon: `umoci unpack` makes an
# OCI runtime bundle of it, and runc, the reference OCI runtime, runs that bundle as its config.json says: the image's
# user, entrypoint, environment and working directory, with the root filesystem read-only, a tmpfs on /tmp and the
# state dir mounted from outside, as deploy/kubernetes/daemonset.yaml runs it. Only the arguments after the
# entrypoint are the check's own. Runs as root (CI).
#
#   sudo bash scripts/check-image.sh
#
# Where runc cannot start a container (no cgroups, say), GPUWATCH_IMAGE_RUNTIME=chroot runs the same checks with
# chroot --userspec from the unpacked rootfs (the config.json's user, env and cwd, /proc mounted and unmounted here).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

say() { printf '[check-image] %s\n' "$*"; }
die() {
    printf '[check-image] FAILED: %s\n' "$*" >&2
    exit 1
}

[[ $EUID -eq 0 ]] || die "run as root: umoci unpack keeps the image's file owners, and runc needs root"
VERSION=$(sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' gpuwatch/__init__.py)
LAYOUT=dist/gpuwatch-image
ARCHIVE=dist/gpuwatch-image-$VERSION.tar
RUNTIME=${GPUWATCH_IMAGE_RUNTIME:-runc}
[[ $RUNTIME == runc || $RUNTIME == chroot ]] || die "GPUWATCH_IMAGE_RUNTIME is runc or chroot, not '$RUNTIME'"

WORK=$(mktemp -d /tmp/gpuwatch-check-image.XXXXXX)
BUNDLE=$WORK/bundle
CONTAINERS=("gpuwatch-check-$$-version" "gpuwatch-check-$$-check" "gpuwatch-check-$$-run")
AGENT_PID=
cleanup() {
    [[ -n $AGENT_PID ]] && kill "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
    if [[ $RUNTIME == runc ]]; then
        for c in "${CONTAINERS[@]}"; do runc delete --force "$c" >/dev/null 2>&1 || true; done
    fi
    mountpoint -q "$BUNDLE/rootfs/proc" 2>/dev/null && umount "$BUNDLE/rootfs/proc"
    rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT

say "1/7 build: bash scripts/build-image.sh"
started=$(date +%s)
bash scripts/build-image.sh || die "scripts/build-image.sh failed"
say "    built in $(($(date +%s) - started)) s"
[[ -f $ARCHIVE ]] || die "build-image.sh made no $ARCHIVE"

say "2/7 tools: umoci, $RUNTIME"
if ! command -v umoci >/dev/null || { [[ $RUNTIME == runc ]] && ! command -v runc >/dev/null; }; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq umoci runc >/dev/null; } ||
        die "could not install umoci and runc with apt-get"
fi

say "3/7 image config ($LAYOUT:$VERSION) and archive"
# The image's own config, read from the layout; also checks the archive holds what ctr, podman, docker and skopeo
# read (oci-layout, index.json with the two names, manifest.json, every blob).
image_vars=$(python3 - "$LAYOUT" "$ARCHIVE" "$VERSION" <<'EOF'
import json, pathlib, shlex, sys, tarfile

layout, archive, version = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
def fail(message: str) -> None:
    sys.exit(f"[check-image] FAILED: {message}")
def blob(digest: str) -> pathlib.Path:
    return layout / "blobs" / digest.replace(":", "/", 1)

index = json.loads((layout / "index.json").read_text())
tagged = [d for d in index["manifests"] if d.get("annotations", {}).get("org.opencontainers.image.ref.name") == version]
if len(tagged) != 1:
    fail(f"index.json has {len(tagged)} manifests tagged {version} (org.opencontainers.image.ref.name), not 1")
name = tagged[0]["annotations"].get("io.containerd.image.name")
if name != f"docker.io/library/gpuwatch:{version}":
    fail(f"index.json's io.containerd.image.name is {name!r}, not docker.io/library/gpuwatch:{version}")
manifest = json.loads(blob(tagged[0]["digest"]).read_text())
image = json.loads(blob(manifest["config"]["digest"]).read_text())
config = image["config"]
user = config.get("User", "")
uid, _, gid = user.partition(":")
if not uid.isdigit() or int(uid) == 0 or not gid.isdigit():
    fail(f"the image's user is {user!r}: it must be a numeric non-root UID:GID (kubelet checks runAsNonRoot on it)")
labels = config.get("Labels", {})
if labels.get("org.opencontainers.image.version") != version or labels.get("org.opencontainers.image.licenses") != "Apache-2.0":
    fail(f"labels version/licenses are {labels.get('org.opencontainers.image.version')!r}/{labels.get('org.opencontainers.image.licenses')!r}")
with tarfile.open(archive) as tar:
    names = set(tar.getnames())
wanted = {"oci-layout", "index.json", "manifest.json", *(str(blob(d).relative_to(layout)) for d in
          [tagged[0]["digest"], manifest["config"]["digest"], *(l["digest"] for l in manifest["layers"])])}
if not wanted <= names:
    fail(f"{archive} lacks {sorted(wanted - names)}")
docker = json.loads((layout / "manifest.json").read_text())
if docker[0]["RepoTags"] != [f"gpuwatch:{version}"]:
    fail(f"manifest.json's RepoTags are {docker[0]['RepoTags']}")
size = sum(l["size"] for l in manifest["layers"])
print(f"IMAGE_USER={shlex.quote(user)}")
print(f"ENTRYPOINT={shlex.quote(json.dumps(config.get('Entrypoint') or []))}")
print(f"CMD={shlex.quote(json.dumps(config.get('Cmd') or []))}")
print(f"LAYER_MIB={size / 2**20:.1f}")
EOF
) || die "the image's config or archive is wrong (above)"
eval "$image_vars"
say "    user $IMAGE_USER (non-root), entrypoint $ENTRYPOINT, cmd $CMD"
say "    size: archive $(du -m "$ARCHIVE" | cut -f1) MiB, compressed layer $LAYER_MIB MiB"

say "4/7 unpack: umoci unpack --image $LAYOUT:$VERSION"
umoci unpack --image "$LAYOUT:$VERSION" "$BUNDLE" >/dev/null || die "umoci unpack failed"
say "    root filesystem $(du -sm --apparent-size "$BUNDLE/rootfs" | cut -f1) MiB"
# The runtime's view of the image, from the bundle's config.json: the user, the process, env and cwd.
bundle_vars=$(python3 - "$BUNDLE/config.json" "$ENTRYPOINT" "$CMD" <<'EOF'
import json, shlex, sys

spec = json.load(open(sys.argv[1]))
entrypoint, cmd = json.loads(sys.argv[2]), json.loads(sys.argv[3])
process = spec["process"]
if process["args"] != entrypoint + cmd:
    sys.exit(f"[check-image] FAILED: config.json runs {process['args']}, not the image's entrypoint + cmd {entrypoint + cmd}")
if process["user"]["uid"] == 0:
    sys.exit("[check-image] FAILED: config.json runs the process as root")
print(f"RUN_UID={process['user']['uid']} RUN_GID={process['user']['gid']}")
print(f"RUN_CWD={shlex.quote(process.get('cwd', '/'))}")
print("RUN_ENV=(" + " ".join(shlex.quote(e) for e in process.get("env", [])) + ")")
print("RUN_ENTRYPOINT=(" + " ".join(shlex.quote(a) for a in entrypoint) + ")")
EOF
) || die "the bundle's config.json is not the image's (above)"
eval "$bundle_vars"
say "    config.json: uid $RUN_UID gid $RUN_GID, cwd $RUN_CWD, args ${RUN_ENTRYPOINT[*]} + image cmd, ${#RUN_ENV[@]} env vars"

# The state dir, as the DaemonSet's hostPath: made outside, owned by the image's user.
STATE=$WORK/state
install -d -m 0750 -o "$RUN_UID" -g "$RUN_GID" "$STATE"

# runc: the bundle's config.json with only the arguments after the entrypoint replaced, no terminal, a read-only root,
# a tmpfs /tmp and $STATE on /var/lib/gpuwatch. The container keeps its own network namespace (loopback only), as a
# pod has: the default listen address :9845 is free there.
runc_config() {
    python3 - "$BUNDLE/config.json" "$STATE" "$@" <<'EOF'
import json, sys

path, state, args = sys.argv[1], sys.argv[2], sys.argv[3:]
spec = json.load(open(path))
spec.setdefault("x-original-args", spec["process"]["args"])
entrypoint_length = len(spec["x-original-args"]) - int(__import__("os").environ["CMD_LENGTH"])
spec["process"]["args"] = spec["x-original-args"][:entrypoint_length] + args
spec["process"]["terminal"] = False
spec["root"]["readonly"] = True
spec["mounts"] = [m for m in spec["mounts"] if m["destination"] not in ("/tmp", "/var/lib/gpuwatch")] + [
    {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777", "size=16m"]},
    {"destination": "/var/lib/gpuwatch", "type": "bind", "source": state, "options": ["rbind", "rw"]},
]
json.dump(spec, open(path, "w"), indent=1)
EOF
}
CMD_LENGTH=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$CMD")
export CMD_LENGTH

# Runs the image's entrypoint with ARGS (in place of the image's cmd), stdout+stderr to $WORK/NAME.log, by exec:
# call it in a subshell, ( run_image ... ) or run_image ... &, so that $! is the runtime's (or the agent's) own PID.
run_image() {
    local name=$1
    shift
    if [[ $RUNTIME == runc ]]; then
        runc_config "$@"
        cd "$BUNDLE"
        exec runc run "gpuwatch-check-$$-$name" >"$WORK/$name.log" 2>&1
    else
        exec chroot --userspec="$RUN_UID:$RUN_GID" "$BUNDLE/rootfs" /usr/bin/env -i -C "$RUN_CWD" "${RUN_ENV[@]}" \
            "${RUN_ENTRYPOINT[@]}" "$@" >"$WORK/$name.log" 2>&1
    fi
}
if [[ $RUNTIME == chroot ]]; then
    mount -t proc proc "$BUNDLE/rootfs/proc"
    # No network namespace here: the checks use a free loopback port of this host.
    PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    LISTEN=(--listen "127.0.0.1:$PORT")
else
    PORT=9845
    LISTEN=()
fi

say "5/7 $RUNTIME: gpuwatch version"
(run_image version version) || die "gpuwatch version exited $?: $(cat "$WORK/version.log")"
sed 's/^/    | /' "$WORK/version.log"
head -1 "$WORK/version.log" | grep -q "^gpuwatch $VERSION " || die "gpuwatch version does not print $VERSION"

say "6/7 $RUNTIME: gpuwatch check --backend simulated"
(run_image check check --backend simulated "${LISTEN[@]}") || {
    cat "$WORK/check.log" >&2
    die "gpuwatch check --backend simulated exited non-zero in the image (above)"
}
sed 's/^/    | /' "$WORK/check.log"

say "7/7 $RUNTIME: gpuwatch run --backend simulated (the image's cmd), /metrics on 127.0.0.1:$PORT, SIGTERM"
run_image run run --backend simulated --poll-interval 1 "${LISTEN[@]}" &
AGENT_PID=$!
FETCH=(/opt/gpuwatch/bin/python -c '
import sys, time, urllib.request
for _ in range(60):
    try:
        body = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
        if "gpuwatch_gpus_detected" in body:
            sys.stdout.write(body)
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.5)
sys.exit("no /metrics with gpuwatch_gpus_detected in 30 s")' "http://127.0.0.1:$PORT/metrics")
if [[ $RUNTIME == runc ]]; then
    # Fetched from inside the container (its own loopback), as the image's user.
    for _ in $(seq 50); do
        [[ $(runc state "gpuwatch-check-$$-run" 2>/dev/null) == *'"status": "running"'* ]] && break
        sleep 0.2
    done
    runc exec --user "$RUN_UID:$RUN_GID" "gpuwatch-check-$$-run" "${FETCH[@]}" >"$WORK/metrics.txt" 2>"$WORK/fetch.log" ||
        die "no /metrics from the agent in the container: $(cat "$WORK/fetch.log"; tail -20 "$WORK/run.log")"
    runc kill "gpuwatch-check-$$-run" TERM
else
    python3 -c "${FETCH[2]}" "http://127.0.0.1:$PORT/metrics" >"$WORK/metrics.txt" 2>"$WORK/fetch.log" ||
        die "no /metrics from the agent: $(cat "$WORK/fetch.log"; tail -20 "$WORK/run.log")"
    kill -TERM "$AGENT_PID"
fi
grep -q "^gpuwatch_build_info{.*version=\"$VERSION\".*} 1" "$WORK/metrics.txt" ||
    die "/metrics has no gpuwatch_build_info for version $VERSION"
gpus=$(awk '$1 ~ /^gpuwatch_gpus_detected({|$)/ {print $2; exit}' "$WORK/metrics.txt")
[[ -n $gpus && $gpus != 0* ]] || die "/metrics says gpuwatch_gpus_detected '${gpus}' (want the simulated GPUs)"
say "    /metrics: $(wc -l <"$WORK/metrics.txt") lines, gpuwatch_gpus_detected $gpus, $(grep -m1 '^gpuwatch_build_info' "$WORK/metrics.txt")"
status=0
wait "$AGENT_PID" || status=$?
AGENT_PID=
((status == 0)) || die "the agent exited $status after SIGTERM (want 0): $(tail -20 "$WORK/run.log")"
say "    SIGTERM: the agent stopped with exit 0"
! grep -E "Traceback|Warning|WARNING|ERROR" "$WORK/run.log" || die "the agent logged the warnings or errors above"
say "ok: gpuwatch:$VERSION runs as $IMAGE_USER ($ARCHIVE, $(du -m "$ARCHIVE" | cut -f1) MiB)"
