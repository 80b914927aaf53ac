#!/bin/sh
# dkms stand-in of the installer test kit (packaged as the `dkms` RPM of the test EPEL repo).
# It follows DKMS 3's command interface and on-disk layout (add, build, install, status, remove;
# -m, -v, -k, -q, --force, --all; /var/lib/dkms/<m>/<v>/{source,build/make.log,<k>/<arch>/module},
# DEST_MODULE_LOCATION under /lib/modules/<k>, .ko.xz when the kernel's .config compresses
# modules, depmod after install and remove, DKMS's exit codes and messages). What it cannot do
# in a test root, which has no compiler, is run MAKE[0]: its "build" links each
# BUILT_MODULE_NAME from the <name>.o_binary object the sources ship (as NVIDIA's proprietary
# sources ship nv-kernel.o_binary) and fails like a failed kbuild when one is missing.
# As in DKMS 3, the module name is -m's (and the source dir /usr/src/<m>-<v>), not dkms.conf's
# PACKAGE_NAME (NVIDIA's open package: -m nvidia-open, PACKAGE_NAME="nvidia"); build and install
# add a module that is not added yet, and a module already built or installed is skipped.
set -u
tree=/var/lib/dkms
arch=$(uname -m)

command=${1:-}
[ $# -gt 0 ] && shift
module= version= kernel= quiet= all= force=
while [ $# -gt 0 ]; do
  case $1 in
    -m) module=$2; shift ;;
    -v) version=$2; shift ;;
    -k) kernel=$2; shift ;;
    -a|--arch) arch=$2; shift ;;
    -q|--quiet) quiet=1 ;;
    --all) all=1 ;;
    --force) force=1 ;;
    -*) ;;
    */*) module=${1%%/*}; version=${1#*/} ;;
  esac
  shift
done
case $module in */*) version=${module#*/}; module=${module%%/*} ;; esac
[ -n "$kernel" ] || kernel=$(uname -r)

die() {  # DKMS's error(): a blank line, "Error! " and each message on its own line
  code=$1; shift
  { echo; printf 'Error! %s\n' "$1"; shift; for line in "$@"; do printf '%s\n' "$line"; done; } >&2
  exit "$code"
}
say() { [ -n "$quiet" ] || printf '%s\n' "$*"; }

source_dir=/usr/src/$module-$version
conf=$source_dir/dkms.conf
base=$tree/$module/$version

conf_value() {  # conf_value NAME INDEX
  sed -n "s/^$1\[$2\]=\"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "$conf" | head -n 1
}
module_count() { grep -c '^BUILT_MODULE_NAME\[' "$conf"; }
kernel_dir() {
  for dir in "/lib/modules/$1/build" "/usr/src/kernels/$1"; do
    [ -f "$dir/Makefile" ] && { echo "$dir"; return 0; }
  done
  return 1
}
compressed() { grep -q '^CONFIG_MODULE_COMPRESS_XZ=y' "$(kernel_dir "$1")/.config" 2>/dev/null; }
installed_on() {  # every module's file is where install puts it
  i=0; n=$(module_count)
  while [ "$i" -lt "$n" ]; do
    dest=/lib/modules/$1$(conf_value DEST_MODULE_LOCATION "$i")/$(conf_value BUILT_MODULE_NAME "$i")
    [ -f "$dest.ko" ] || [ -f "$dest.ko.xz" ] || return 1
    i=$((i + 1))
  done
}
need_module() { [ -n "$module" ] && [ -n "$version" ] || die 1 "Invalid number of arguments passed." "Usage: $command <module>/<module-version> or $command -m <module>/<module-version> or $command -m <module> -v <module-version>"; }
need_added() {
  [ -e "$base/source" ] || die 3 "The module/version combo: $module/$version is not located in the DKMS tree."
}
check_conf() {  # read_conf_strict_or_die: PACKAGE_NAME and PACKAGE_VERSION must be set
  grep -q '^PACKAGE_NAME=..*' "$conf" && grep -q '^PACKAGE_VERSION=..*' "$conf" ||
    die 8 "Bad conf file." "File: $conf does not represent a valid dkms.conf file."
}
run_depmod() { command -v depmod >/dev/null 2>&1 && depmod -a "$1" >/dev/null 2>&1 || :; }

do_add() {
  need_module
  [ -e "$base/source" ] && die 3 "DKMS tree already contains: $module/$version" "You cannot add the same module/version combo more than once."
  [ -d "$source_dir" ] || die 2 "Could not find module source directory." "Directory: $source_dir does not exist."
  [ -f "$conf" ] || die 4 "Could not locate dkms.conf file." "File: $conf does not exist."
  check_conf
  say "Creating symlink $base/source -> $source_dir"
  mkdir -p "$base/build"
  ln -s "$source_dir" "$base/source"
}

do_build() {
  need_module
  [ -e "$base/source" ] || { do_add; say ""; }
  if [ -d "$base/$kernel/$arch/module" ] && [ -z "$force" ]; then
    say "Module $module/$version already built for kernel $kernel ($arch), skip. You may override by specifying --force."
    return 0
  fi
  check_conf
  ksrc=$(kernel_dir "$kernel") ||
    die 1 "Your kernel headers for kernel $kernel cannot be found at /lib/modules/$kernel/build or /lib/modules/$kernel/source. Please install the linux-headers-$kernel package or use the --kernelsourcedir option to tell DKMS where it's located."
  rm -rf "$base/build" "$base/$kernel/$arch"
  mkdir -p "$base/build"
  cp -R "$base/source/." "$base/build/"
  log=$base/build/make.log
  make_line=$(sed -n 's/^MAKE\[0\]="\(.*\)"$/\1/p' "$conf")
  {
    echo "DKMS make.log for $module-$version for kernel $kernel ($arch)"
    date
    echo "make -C $ksrc: $make_line"
  } > "$log"
  say "Building module(s)..."
  i=0; n=$(module_count)
  while [ "$i" -lt "$n" ]; do
    name=$(conf_value BUILT_MODULE_NAME "$i")
    if [ ! -f "$base/build/$name.o_binary" ]; then
      {
        echo "make[2]: *** No rule to make target '$base/build/$name.o_binary', needed by '$base/build/$name.ko'.  Stop."
        echo "make[1]: *** [Makefile:2026: $base/build] Error 2"
        echo "make: *** [Makefile:234: __sub-make] Error 2"
      } >> "$log"
      printf 'Error! Bad return status for module build on kernel: %s (%s)\nConsult %s for more information.\n' "$kernel" "$arch" "$log" >&2
      exit 10
    fi
    cp "$base/build/$name.o_binary" "$base/build/$name.ko"
    echo "  LD [M]  $base/build/$name.ko" >> "$log"
    i=$((i + 1))
  done
  mkdir -p "$base/$kernel/$arch/module" "$base/$kernel/$arch/log"
  i=0
  while [ "$i" -lt "$n" ]; do
    cp "$base/build/$(conf_value BUILT_MODULE_NAME "$i").ko" "$base/$kernel/$arch/module/"
    i=$((i + 1))
  done
  cp "$log" "$base/$kernel/$arch/log/make.log"
  say "Cleaning build area... done."
}

do_install() {
  need_module
  if [ -d "$base/$kernel/$arch/module" ] && installed_on "$kernel" && [ -z "$force" ]; then
    say "Module $module/$version already installed on kernel $kernel ($arch), skip. You may override by specifying --force."
    return 0
  fi
  [ -d "$base/$kernel/$arch/module" ] || do_build
  i=0; n=$(module_count)
  while [ "$i" -lt "$n" ]; do
    name=$(conf_value BUILT_MODULE_NAME "$i")
    dest=/lib/modules/$kernel$(conf_value DEST_MODULE_LOCATION "$i")
    mkdir -p "$dest"
    rm -f "$dest/$name.ko" "$dest/$name.ko.xz"
    if compressed "$kernel"; then
      xz --check=crc32 --lzma2=dict=1MiB -c "$base/$kernel/$arch/module/$name.ko" > "$dest/$name.ko.xz"
    else
      cp "$base/$kernel/$arch/module/$name.ko" "$dest/$name.ko"
    fi
    say "$name.ko: Installing module to $dest/"
    i=$((i + 1))
  done
  run_depmod "$kernel"
}

do_status() {
  for mdir in "$tree"/*/; do
    [ -d "$mdir" ] || continue
    m=$(basename "$mdir")
    [ -z "$module" ] || [ "$m" = "$module" ] || continue
    for vdir in "$mdir"*/; do
      [ -d "$vdir" ] || continue
      v=$(basename "$vdir")
      [ -z "$version" ] || [ "$v" = "$version" ] || continue
      shown=
      for kdir in "$vdir"*/; do
        k=$(basename "$kdir")
        case $k in source|build) continue ;; esac
        [ -d "$kdir$arch/module" ] || continue
        [ "$kernel" = "$(uname -r)" ] || [ "$k" = "$kernel" ] || continue
        state=built
        conf=/usr/src/$m-$v/dkms.conf
        installed_on "$k" && state=installed
        echo "$m/$v, $k, $arch: $state"
        shown=1
      done
      [ -n "$shown" ] || echo "$m/$v: added"
    done
  done
}

do_remove() {
  need_module
  need_added
  for kdir in "$base"/*/; do
    k=$(basename "$kdir")
    case $k in source|build) continue ;; esac
    [ -n "$all" ] || [ "$k" = "$kernel" ] || continue
    i=0; n=$(module_count)
    while [ "$i" -lt "$n" ]; do
      dest=/lib/modules/$k$(conf_value DEST_MODULE_LOCATION "$i")/$(conf_value BUILT_MODULE_NAME "$i")
      rm -f "$dest.ko" "$dest.ko.xz"
      i=$((i + 1))
    done
    rm -rf "$kdir"
    run_depmod "$k"
    say "Module $module-$version for kernel $k ($arch): Before uninstall, this module version was ACTIVE on this kernel. Deleting module from kernel."
  done
  if [ -n "$all" ]; then
    rm -rf "$base"
    rmdir "$tree/$module" 2>/dev/null || :
    say "Deleting module $module-$version completely from the DKMS tree."
  fi
}

case $command in
  add) do_add ;;
  build) do_build ;;
  install) do_install ;;
  status) do_status ;;
  remove) do_remove ;;
  *) die 1 "Unknown command: $command" ;;
esac
