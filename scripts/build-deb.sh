#!/usr/bin/env bash
# Build the Debian package gpuwatch_<version>_<arch>.deb into dist/ with Debian's own tooling (dpkg-buildpackage,
# debhelper, dh-virtualenv), from a clean copy of this tree so the checkout gets no build output.
#
#   bash scripts/build-deb.sh
#
# The version is gpuwatch/__init__.py's __version__ (the one version source): when debian/changelog's newest entry
# names another version, the copy gets an entry for this one on top. As root it installs missing build dependencies
# with apt-get; as another user it names them and stops. The venv's Python packages come from pip's configured index
# (PyPI by default). Needs a Debian 12 (bookworm) or later machine.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { echo "build-deb: $*"; }
die() { echo "build-deb: ERROR: $*" >&2; exit 1; }

[ -f "$repo/debian/control" ] || die "no debian/control in $repo: run this from a gpuwatch checkout"
command -v dpkg >/dev/null 2>&1 || die "dpkg not found: the Debian package is built on Debian 12 (bookworm) or later"

# --- build dependencies ------------------------------------------------------------------------------------------
# debian/control's Build-Depends, plus what dpkg-buildpackage itself needs (dpkg-dev, build-essential) and git for
# the clean copy.
needed=(dpkg-dev build-essential debhelper dh-virtualenv python3 python3-venv help2man git)
missing=()
for package in "${needed[@]}"; do
  dpkg-query -W -f='${Status}\n' "$package" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    die "missing build dependencies: ${missing[*]}; install them (sudo apt-get install -y ${missing[*]}) or run this as root"
  fi
  say "installing build dependencies: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
(cd "$repo" && dpkg-checkbuilddeps) || die "build dependencies in debian/control are not met (see above)"

# --- version -----------------------------------------------------------------------------------------------------
version="$(sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' "$repo/gpuwatch/__init__.py")"
[ -n "$version" ] || die "no __version__ = \"X.Y.Z\" line in gpuwatch/__init__.py"

# --- a clean copy --------------------------------------------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/gpuwatch-deb.XXXXXX")"
trap 'rm -rf "$work"' EXIT
src="$work/gpuwatch-$version"
mkdir "$src"
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # Tracked files and new files git does not ignore, as they are in the working tree (uncommitted edits included);
  # never .venv, build/, dist/ or caches.
  # shellcheck disable=SC2016  # the inner sh expands "$f", not this one
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard \
    | xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh \
    | tar --null -T - -cf - | tar -C "$src" -xf -) || die "copying the tree to $src failed"
else
  tar -C "$repo" --exclude=./.venv --exclude=./dist --exclude=./build --exclude=.git --exclude='__pycache__' \
    --exclude='*.egg-info' -cf - . | tar -C "$src" -xf -
fi

changelog_version="$(cd "$src" && dpkg-parsechangelog -S Version)"
if [ "$changelog_version" != "$version" ]; then
  say "debian/changelog's newest entry is $changelog_version; adding an entry for $version (gpuwatch/__init__.py) to the build copy"
  maintainer="$(sed -n 's/^Maintainer: //p' "$src/debian/control")"
  date="$(git -C "$repo" log -1 --format=%cD 2>/dev/null || date -R)"
  {
    printf 'gpuwatch (%s) bookworm; urgency=medium\n\n  * Release %s.\n\n -- %s  %s\n\n' \
      "$version" "$version" "$maintainer" "$date"
    cat "$src/debian/changelog"
  } > "$work/changelog" && mv "$work/changelog" "$src/debian/changelog"
fi

# --- build ---------------------------------------------------------------------------------------------------------
arch="$(dpkg --print-architecture)"
say "building gpuwatch $version for $arch in $src (dpkg-buildpackage -us -uc -b)"
started=$SECONDS
(cd "$src" && dpkg-buildpackage -us -uc -b) > "$work/build.log" 2>&1 || {
  tail -n 60 "$work/build.log" >&2
  die "dpkg-buildpackage failed (the last 60 lines of its log are above)"
}

mkdir -p "$repo/dist"
rm -f "$repo"/dist/gpuwatch_*.deb "$repo"/dist/gpuwatch_*.buildinfo "$repo"/dist/gpuwatch_*.changes
for file in "$work"/gpuwatch_"${version}"_"${arch}".deb "$work"/gpuwatch_"${version}"_"${arch}".buildinfo \
  "$work"/gpuwatch_"${version}"_"${arch}".changes; do
  [ -f "$file" ] || die "dpkg-buildpackage did not produce $(basename "$file")"
  cp "$file" "$repo/dist/"
done
deb="$repo/dist/gpuwatch_${version}_${arch}.deb"
say "built in $((SECONDS - started)) s: $deb ($(du -h "$deb" | cut -f1); also its .buildinfo and .changes in dist/)"
