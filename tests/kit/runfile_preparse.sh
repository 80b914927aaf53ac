# NVIDIA's .run parses its own options anywhere on the command line and forwards every other
# argument to ./nvidia-installer; stock makeself stops at the first unknown one. This block
# turns NVIDIA's spelling into makeself's before makeself's own option loop runs.
version="@VERSION@"
nv_target_os="Linux"
nv_target_arch="@ARCH@"

case "$1" in
--version-string)
    echo "$version"
    exit 0
    ;;
--target-directory)
    echo "$targetdir"
    exit 0
    ;;
--label)
    echo "$label"
    exit 0
    ;;
-h | --help | -A | --advanced-options)
    echo "Usage: $0 [options]"
    echo "  First argument only: --help, -A/--advanced-options, --info, --list, --check,"
    echo "    --version-string, --target-directory, --label"
    echo "  Anywhere: -x/--extract-only, --target DIR, --keep, --tmpdir DIR"
    echo "  Everything else is passed to ./nvidia-installer (see $0 -- --help)."
    exit 0
    ;;
--info | --list | --check | --lsm)
    nv_info_action=y
    ;;
esac

if test x"$nv_info_action" != xy; then
    nv_extract=n
    nv_keep=n
    nv_target_set=n
    nv_count=$#
    while test "$nv_count" -gt 0; do
        nv_arg="$1"
        shift
        nv_count=$((nv_count - 1))
        case "$nv_arg" in
        -x | --extract-only)
            nv_extract=y
            ;;
        --keep)
            nv_keep=y
            ;;
        --target | --tmpdir)
            if test "$nv_count" -eq 0; then
                echo "ERROR: $nv_arg requires an argument." >&2
                exit 1
            fi
            if test "$nv_arg" = --target; then
                nv_target="$1"
                nv_target_set=y
            else
                TMPROOT="$1"
                set -- "$@" --tmpdir "$1"
            fi
            shift
            nv_count=$((nv_count - 1))
            ;;
        --tmpdir=*)
            TMPROOT="${nv_arg#--tmpdir=}"
            set -- "$@" "$nv_arg"
            ;;
        *)
            set -- "$@" "$nv_arg"
            ;;
        esac
    done

    # NVIDIA's makeself (1.6.0-nv2) checks the platform only when it would run the installer:
    # -x extracts another architecture's .run (a cross builder does).
    if test "$nv_extract" = n && { test "`uname -s`" != "$nv_target_os" || test "`uname -m`" != "$nv_target_arch"; }; then
        echo "ERROR: this .run file is intended for the $nv_target_os-$nv_target_arch platform, but you appear to be running on `uname -s`-`uname -m`.  Aborting installation." >&2
        exit 1
    fi

    if test "$nv_extract$nv_keep$nv_target_set" = nnn; then
        nv_probe="$TMPROOT/.nvidia-exec-probe.$$"
        if { echo '#!/bin/sh'; echo 'exit 0'; } > "$nv_probe" 2>/dev/null && chmod 700 "$nv_probe" && "$nv_probe"; then
            rm -f "$nv_probe"
        else
            rm -f "$nv_probe"
            echo "ERROR: Temporary directory $TMPROOT is not executable - use the --tmpdir option to specify a different one." >&2
            exit 1
        fi
    fi

    if test "$nv_target_set" = y; then
        set -- --target "$nv_target" -- "$@"
    else
        set -- -- "$@"
    fi
    if test "$nv_keep" = y; then
        set -- --keep "$@"
    fi
    if test "$nv_extract" = y; then
        set -- --noexec --keep "$@"
    fi
fi

