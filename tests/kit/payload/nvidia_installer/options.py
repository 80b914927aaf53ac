"""nvidia-installer's command line: the real option names, short and long, `=value` or not."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from .errors import InstallerError


class Spec(NamedTuple):
    long: str
    short: str = ""
    takes_value: bool = False
    aliases: tuple[str, ...] = ()


SPECS = (
    Spec("help", "h"),
    Spec("advanced-options", "A"),
    Spec("version", "v"),
    Spec("silent", "s"),
    Spec("accept-license", "a"),
    Spec("no-questions", "q"),
    Spec("no-network", "N"),
    Spec("ui", takes_value=True),
    Spec("log-file-name", takes_value=True),
    Spec("tmpdir", takes_value=True),
    Spec("kernel-source-path", takes_value=True),
    Spec("kernel-output-path", takes_value=True),
    Spec("kernel-name", "k", takes_value=True),
    Spec("kernel-install-path", takes_value=True),
    Spec("kernel-module-type", "M", takes_value=True),
    Spec("kernel-module-build-directory", "m", takes_value=True),
    Spec("print-recommended-kernel-module-type"),
    Spec("kernel-modules-only", "K", aliases=("kernel-module-only",)),
    Spec("no-kernel-modules", aliases=("no-kernel-module",)),
    Spec("skip-module-load"),
    Spec("skip-depmod"),
    Spec("no-drm"),
    Spec("no-peermem"),
    Spec("no-unified-memory"),
    Spec("concurrency-level", "j", takes_value=True),
    Spec("module-signing-secret-key", takes_value=True),
    Spec("module-signing-public-key", takes_value=True),
    Spec("module-signing-hash", takes_value=True),
    Spec("utility-prefix", takes_value=True),
    Spec("utility-libdir", takes_value=True),
    Spec("opengl-prefix", takes_value=True),
    Spec("opengl-libdir", takes_value=True),
    Spec("x-prefix", takes_value=True),
    Spec("x-module-path", takes_value=True),
    Spec("x-library-path", takes_value=True),
    Spec("documentation-prefix", takes_value=True),
    Spec("override-file-type-destination", takes_value=True),
    Spec("no-install-compat32-libs"),
    Spec("no-nvidia-modprobe"),
    Spec("no-rpms"),
    Spec("no-backup"),
    Spec("no-check-for-alternate-installs"),
    Spec("no-distro-scripts"),
    Spec("no-systemd"),
    Spec("no-rebuild-initramfs"),
    Spec("install-libglvnd"),
    Spec("no-install-libglvnd"),
    Spec("no-nouveau-check", "z"),
    Spec("disable-nouveau", "Z"),
    Spec("dkms"),
    Spec("no-dkms"),
    Spec("uninstall"),
    Spec("sanity"),
)


@dataclass
class Options:
    """Parsed flags; None means "not given, use the real tool's default"."""

    help: bool = False
    advanced_options: bool = False
    version: bool = False
    silent: bool = False
    accept_license: bool = False
    no_questions: bool = False
    no_network: bool = False
    ui: Optional[str] = None
    log_file_name: str = "/var/log/nvidia-installer.log"
    tmpdir: Optional[str] = None
    kernel_source_path: Optional[str] = None
    kernel_output_path: Optional[str] = None
    kernel_name: Optional[str] = None
    kernel_install_path: Optional[str] = None
    kernel_module_type: Optional[str] = None
    kernel_module_build_directory: Optional[str] = None
    print_recommended_kernel_module_type: bool = False
    kernel_modules_only: bool = False
    no_kernel_modules: bool = False
    skip_module_load: bool = False
    skip_depmod: bool = False
    no_drm: bool = False
    no_peermem: bool = False
    no_unified_memory: bool = False
    concurrency_level: Optional[str] = None
    module_signing_secret_key: Optional[str] = None
    module_signing_public_key: Optional[str] = None
    module_signing_hash: str = "sha256"
    utility_prefix: str = "/usr"
    utility_libdir: Optional[str] = None
    opengl_prefix: str = "/usr"
    opengl_libdir: Optional[str] = None
    x_prefix: Optional[str] = None
    x_module_path: Optional[str] = None
    x_library_path: Optional[str] = None
    documentation_prefix: str = "/usr"
    override_file_type_destination: list[str] = field(default_factory=list)
    no_install_compat32_libs: bool = False
    no_nvidia_modprobe: bool = False
    no_rpms: bool = False
    no_backup: bool = False
    no_check_for_alternate_installs: bool = False
    no_distro_scripts: bool = False
    no_systemd: bool = False
    no_rebuild_initramfs: bool = False
    install_libglvnd: bool = False
    no_install_libglvnd: bool = False
    no_nouveau_check: bool = False
    disable_nouveau: bool = False
    dkms: bool = False
    no_dkms: bool = False
    uninstall: bool = False
    sanity: bool = False


def _lookup() -> dict[str, Spec]:
    table: dict[str, Spec] = {}
    for spec in SPECS:
        table["--" + spec.long] = spec
        for alias in spec.aliases:
            table["--" + alias] = spec
        if spec.short:
            table["-" + spec.short] = spec
    return table


def parse(argv: list[str]) -> Options:
    """Parse like nvgetopt; an unknown option or a missing value raises InstallerError."""
    table = _lookup()
    values: dict[str, object] = {}
    overrides: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, has_inline, inline = arg.partition("=")
        if not arg.startswith("--") and len(arg) > 2 and not has_inline:
            name, inline, has_inline = arg[:2], arg[2:], "="
        spec = table.get(name) if arg.startswith("-") else None
        if spec is None:
            raise InstallerError(f'Unrecognized option: "{arg}"')
        dest = spec.long.replace("-", "_")
        if not spec.takes_value:
            if has_inline:
                raise InstallerError(f'Option "{name}" does not take an argument.')
            values[dest] = True
            continue
        if not has_inline:
            if not args:
                raise InstallerError(f'Option "{name}" requires an argument.')
            inline = args.pop(0)
        if dest == "override_file_type_destination":
            overrides.append(inline)
        else:
            values[dest] = inline
    return Options(override_file_type_destination=overrides, **values)  # type: ignore[arg-type]
