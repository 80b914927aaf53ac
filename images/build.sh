#!/usr/bin/env bash
# Build (and optionally push) the installer images: Ubuntu 20.04/22.04/24.04/26.04 and Debian 12/13
# (one Dockerfile, images/ubuntu, with Debian as its DISTRO build argument), Rocky 8/9/10
# (images/rocky) and SLES 15 (images/suse; it serves openSUSE Leap 15 too).
#
#   images/build.sh [--push] [--dry-run] [--only debian|ubuntu|rocky|sles|<tag suffix>] [--help]
#
# Environment:
#   REGISTRY    image repository prefix          (default: registry.example.com)
#   IMAGE       image name under REGISTRY        (default: nvidia-driver-installer)
#   TAG         version part of every tag        (default: the version in pyproject.toml)
#   PLATFORMS   platforms, comma-separated       (default: linux/amd64; several need --push;
#               buildx, or buildah: one manifest list per tag, arm64 RUN steps under qemu-user)
#   SOURCE_URL  org.opencontainers.image.source  (default: the git remote "origin", if any)
#   BUILDER     buildx | docker | buildah        (default: buildx when `docker buildx` works)
#   DOCKER      the docker client to call        (default: docker)
#   BUILDAH     buildah and its global options   (default: buildah --storage-driver vfs)
#   BUILD_OPTS  extra words for every build      (e.g. --build-arg BASE_IMAGE=...)
#
# Tags: $REGISTRY/$IMAGE:$TAG-debian12, -debian13, -ubuntu20.04, -ubuntu22.04, -ubuntu24.04,
# -ubuntu26.04, -rocky8, -rocky9, -rocky10, -sles15.
# The build context is the repository root; each Dockerfile has its own .dockerignore.
# BUILDER=buildah needs no daemon (root, --isolation chroot); --push then pushes each tag.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)

push=false
dry_run=false
only=""

usage() { sed -n '2,23s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --push) push=true ;;
        --dry-run) dry_run=true ;;
        --only) only="${2:?--only needs debian, ubuntu, rocky, sles or a tag suffix}"; shift ;;
        --only=*) only="${1#--only=}" ;;
        -h|--help) usage; exit 0 ;;
        *) echo "build.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
# A family, or one image by its tag suffix (debian12: CI's image test has a bookworm base only).
case "$only" in ""|debian|ubuntu|rocky|sles|debian12|debian13|ubuntu20.04|ubuntu22.04|ubuntu24.04|ubuntu26.04|rocky8|rocky9|rocky10|sles15) ;;
    *) echo "build.sh: --only takes debian, ubuntu, rocky, sles or a tag suffix (debian12, ...)" >&2; exit 2 ;; esac

DOCKER=${DOCKER:-docker}
REGISTRY=${REGISTRY:-registry.example.com}
IMAGE=${IMAGE:-nvidia-driver-installer}
PLATFORMS=${PLATFORMS:-linux/amd64}
if [ -z "${TAG:-}" ]; then
    TAG=$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$repo/pyproject.toml" | head -n1)
fi
if [ -z "$TAG" ]; then
    echo "build.sh: TAG is empty and pyproject.toml has no version" >&2
    exit 2
fi
# Reading git metadata only; nothing here changes the repository.
revision=$(git -C "$repo" rev-parse --verify --quiet HEAD 2>/dev/null || echo unknown)
if [ -z "${SOURCE_URL:-}" ]; then
    SOURCE_URL=$(git -C "$repo" remote get-url origin 2>/dev/null || true)
    SOURCE_URL=${SOURCE_URL:-https://github.com/example/nvidia-driver-installer}
fi

if [ -z "${BUILDER:-}" ]; then
    if "$DOCKER" buildx version >/dev/null 2>&1; then BUILDER=buildx; else BUILDER=docker; fi
fi
case "$BUILDER" in buildx|docker|buildah) ;; *) echo "build.sh: BUILDER must be buildx, docker or buildah" >&2; exit 2 ;; esac
if [ "$BUILDER" = docker ] && [ "$PLATFORMS" != linux/amd64 ]; then
    echo "build.sh: PLATFORMS=$PLATFORMS needs docker buildx or BUILDER=buildah" >&2
    exit 2
fi
if [ "$BUILDER" = buildx ] && [[ "$PLATFORMS" == *,* ]] && ! $push; then
    echo "build.sh: several PLATFORMS can only be pushed (buildx cannot --load them); add --push" >&2
    exit 2
fi
IFS=, read -r -a platforms <<<"$PLATFORMS"

run() {
    # Print every command shell-quoted; run it unless --dry-run.
    printf '+'
    printf ' %q' "$@"
    printf '\n'
    if ! $dry_run; then "$@"; fi
}

read -r -a buildah <<<"${BUILDAH:-buildah --storage-driver vfs}"
read -r -a build_opts <<<"${BUILD_OPTS:-}"

build_one() {
    # dir: images/<dir>/Dockerfile; name and version: the tag suffix and the version build args.
    local dir=$1 name=$2 version=$3
    local ref="$REGISTRY/$IMAGE:$TAG-$name$version"
    local args=(--file "$here/$dir/Dockerfile")
    if [ "$dir" = ubuntu ]; then
        args+=(--build-arg "DISTRO=$name" --build-arg "DISTRO_VERSION=$version")
    elif [ "$dir" = suse ]; then
        args+=(--build-arg "SLE_VERSION=$version")
    else
        args+=(--build-arg "ROCKY_VERSION=$version")
    fi
    args+=(
        --build-arg "VERSION=$TAG"
        --build-arg "REVISION=$revision"
        --build-arg "SOURCE=$SOURCE_URL"
        ${build_opts[@]+"${build_opts[@]}"}
    )
    if [ "$BUILDER" = buildah ] && [ "${#platforms[@]}" -gt 1 ]; then
        # One image per platform, added to the manifest list $ref; a foreign platform's RUN
        # steps run under qemu-user-static (binfmt_misc). --tag would name one image, not the list.
        local platform
        run "${buildah[@]}" manifest create "$ref"
        for platform in "${platforms[@]}"; do
            run "${buildah[@]}" build --isolation chroot --platform "$platform" \
                --ignorefile "$here/$dir/Dockerfile.dockerignore" --manifest "$ref" \
                "${args[@]}" "$repo"
        done
        if $push; then run "${buildah[@]}" manifest push --all "$ref" "docker://$ref"; fi
    elif [ "$BUILDER" = buildah ]; then
        local platform_args=()
        [ "$PLATFORMS" = linux/amd64 ] || platform_args=(--platform "$PLATFORMS")
        run "${buildah[@]}" build --isolation chroot ${platform_args[@]+"${platform_args[@]}"} \
            --ignorefile "$here/$dir/Dockerfile.dockerignore" "${args[@]}" --tag "$ref" "$repo"
        if $push; then run "${buildah[@]}" push "$ref"; fi
    elif [ "$BUILDER" = buildx ]; then
        args+=(--tag "$ref")
        if $push; then args+=(--push); else args+=(--load); fi
        run "$DOCKER" buildx build --platform "$PLATFORMS" "${args[@]}" "$repo"
    else
        # The Dockerfiles use RUN --mount and per-Dockerfile .dockerignore: BuildKit only.
        run env DOCKER_BUILDKIT=1 "$DOCKER" build "${args[@]}" --tag "$ref" "$repo"
        if $push; then run "$DOCKER" push "$ref"; fi
    fi
}

wanted() { [ -z "$only" ] || [ "$only" = "$1" ] || [ "$only" = "$1$2" ]; }

echo "# builder=$BUILDER registry=$REGISTRY image=$IMAGE tag=$TAG platforms=$PLATFORMS push=$push"
for image in "ubuntu debian 12" "ubuntu debian 13" "ubuntu ubuntu 20.04" "ubuntu ubuntu 22.04" \
             "ubuntu ubuntu 24.04" "ubuntu ubuntu 26.04" "rocky rocky 8" "rocky rocky 9" \
             "rocky rocky 10" "suse sles 15"; do
    read -r dir name version <<<"$image"
    if wanted "$name" "$version"; then build_one "$dir" "$name" "$version"; fi
done
