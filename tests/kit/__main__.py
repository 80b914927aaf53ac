"""`python3 -m kit build VERSION OUT_DIR [--compile-error] [--kernel-source DIR]` from tests/;
`python3 -m kit fetch-real-parts` and `fetch-trixie-parts` (scripts/install-deps) cache NVIDIA's
real parts."""

from __future__ import annotations

import argparse
from pathlib import Path

from kit.builder import build_runfile


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m kit")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build NVIDIA-Linux-x86_64-VERSION.run")
    build.add_argument("version")
    build.add_argument("out_dir", type=Path)
    build.add_argument("--compile-error", action="store_true")
    build.add_argument("--kernel-source", type=Path)
    commands.add_parser("fetch-real-parts", help="download NVIDIA's real 535.261.03 parts, "
                        "Debian's 6.1.0-47 headers and the arm64 module sources, headers and "
                        "kernel into the test cache (once)")
    commands.add_parser("fetch-trixie-parts", help="download NVIDIA's real 550.163.01 parts, "
                        "trixie's 6.12 headers and a trixie image root with gcc-14 (once)")
    args = parser.parse_args()
    if args.command == "fetch-trixie-parts":
        from kit import trixie_parts

        print("\n".join(str(found) for found in trixie_parts.fetch()))
        return
    if args.command == "fetch-real-parts":
        from kit import arm64_parts, real_parts

        parts, headers = real_parts.fetch()
        arm64 = arm64_parts.fetch()  # needs the amd64 kbuild fetched just above
        print(f"{parts.directory}\n{headers.root}\n{arm64.directory}")
        return
    print(
        build_runfile(
            args.version,
            args.out_dir,
            compile_error=args.compile_error,
            kernel_source=args.kernel_source,
        )
    )


if __name__ == "__main__":
    main()
