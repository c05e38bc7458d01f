#!/usr/bin/env bash
# The release artifacts, each built once and used as an operator would (CI runs this after the tests, as root):
#   scripts/check-wheel.sh  the sdist and the wheel; the wheel in a fresh venv elsewhere: version, check, the demo
#   scripts/check-deb.sh    the .deb: lintian, dpkg -i, check, upgrade over itself, remove, purge, nothing left
#   scripts/check-image.sh  the OCI image: built without a daemon, its entrypoint run from the unpacked image
# The .deb and the image reuse the wheel check-wheel.sh left in dist/. Extra arguments name a subset (wheel deb image).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(wheel deb image)
for step in "${steps[@]}"; do
  case "$step" in
    wheel|deb|image) ;;
    *) echo "check-release.sh: unknown step '$step' (wheel, deb or image)" >&2; exit 2 ;;
  esac
  started=$SECONDS
  echo "check-release.sh: --- $step ---"
  bash "scripts/check-$step.sh"
  echo "check-release.sh: $step passed in $((SECONDS - started)) s"
done
