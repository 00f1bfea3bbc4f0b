#!/usr/bin/env bash
# Build the project's image with podman (or docker), from base and Moses images given by name, and
# optionally run its check stage (make test and make tune inside the image). From the repository root:
#
#   docker/build-local.sh [--check] [--tag rnn-rescorer] [--variant cpu|cuda]
#       [--debian-image IMG] [--cuda-image IMG] [--moses-image IMG] [--shared DIR] [--pip-cert FILE]
#       [--wheels DIR] [--torch-index URL]
#
# Without the options the Dockerfile's defaults are pulled from their registries. The image is tagged
# TAG (default rnn-rescorer). --check builds and tags it the same way, then builds the check stage on
# top of it, tagged TAG-check; that needs podman (it mounts DIR, default ../shared, at /opt/shared for
# that stage; docker build cannot mount).
# --pip-cert: the CA bundle for pip where a proxy re-signs TLS (default: $PIP_CERT when set); the
# whole folder holding FILE is mounted read-only at /host-certs for the build's RUN steps.
# --wheels: a folder of wheels pip looks in first (e.g. a torch build where its index is unreachable);
# --torch-index: where torch comes from otherwise (default: PyTorch's CPU or CUDA index).
set -euo pipefail

tag=rnn-rescorer variant=cpu check=0 shared=../shared pip_cert=${PIP_CERT:-} wheels=""
build_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --check) check=1 ;;
        --tag) tag=$2; shift ;;
        --variant) variant=$2; shift ;;
        --debian-image) build_args+=(--build-arg "DEBIAN_IMAGE=$2"); shift ;;
        --cuda-image) build_args+=(--build-arg "CUDA_IMAGE=$2"); shift ;;
        --moses-image) build_args+=(--build-arg "MOSES_IMAGE=$2"); shift ;;
        --shared) shared=$2; shift ;;
        --pip-cert) pip_cert=$2; shift ;;
        --wheels) wheels=$2; shift ;;
        --torch-index) build_args+=(--build-arg "TORCH_INDEX_URL=$2"); shift ;;
        *) echo "build-local.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
    shift
done

if command -v podman >/dev/null; then
    engine=(podman build --isolation chroot --network host --format docker)
elif command -v docker >/dev/null; then
    engine=(docker build)
else
    echo "build-local.sh: neither podman nor docker found" >&2; exit 1
fi
mounts=()
if [ -n "$pip_cert" ]; then
    mounts+=(-v "$(cd "$(dirname "$pip_cert")" && pwd):/host-certs:ro")
    build_args+=(--build-arg "PIP_CERT=/host-certs/$(basename "$pip_cert")")
fi
if [ -n "$wheels" ]; then
    mounts+=(-v "$(cd "$wheels" && pwd):/host-wheels:ro")
    build_args+=(--build-arg "PIP_FIND_LINKS=/host-wheels")
fi
if [ "$check" = 1 ]; then
    [ "${engine[0]}" = podman ] || { echo "build-local.sh: --check needs podman (a volume mount during the build)" >&2; exit 1; }
    [ -d "$shared/fixtures" ] || { echo "build-local.sh: --check needs the shared data ($shared/fixtures not found)" >&2; exit 1; }
    shared=$(cd "$shared" && pwd)
fi
set -x
# The image itself, as without --check; then the check stage, which reuses its layers.
"${engine[@]}" "${mounts[@]}" "${build_args[@]}" --build-arg "VARIANT=$variant" --target final \
    -f docker/Dockerfile -t "$tag" .
if [ "$check" = 1 ]; then
    "${engine[@]}" "${mounts[@]}" -v "$shared:/opt/shared:ro" "${build_args[@]}" --build-arg "VARIANT=$variant" \
        --target check -f docker/Dockerfile -t "$tag-check" .
fi
