"""Kernel modules and device nodes: load in dependency order, unload safely, nvidia-modprobe."""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from installer import host
from installer.errors import CommandFailed, DeviceNodesFailed, DriverInUse, ModuleLoadFailed
from installer.hostroot import HostRoot
from installer.runner import Runner

log = logging.getLogger(__name__)

# Load order (each depends on the one before); unload in reverse.
LOAD_ORDER = ("nvidia", "nvidia-uvm", "nvidia-modeset")
UNLOAD_ORDER = ("nvidia_drm", "nvidia_peermem", "nvidia_modeset", "nvidia_uvm", "nvidia")
NVIDIA_MAJOR = 195


def kernel_name(module: str) -> str:
    return module.replace("-", "_")


def loaded_modules(root: HostRoot) -> dict[str, int]:
    """name -> references not explained by dependent modules (open files, other holders)."""
    return {
        m.name: max(m.refcount - len(m.users), 0) for m in host.loaded_modules(root)
    }


def loaded_version(root: HostRoot) -> str | None:
    text = root.read_text("/sys/module/nvidia/version")
    return text.strip() if text else None


def all_loaded(root: HostRoot, version: str) -> bool:
    names = loaded_modules(root)
    return loaded_version(root) == version and all(kernel_name(m) in names for m in LOAD_ORDER)


def modprobe_options(root: HostRoot, runner: Runner, module: str) -> list[str]:
    """The `options <module> ...` the host's /etc/modprobe.d sets (for insmod fallback)."""
    result = runner.run([*modprobe_base(root), "--showconfig"], check=False)
    wanted = kernel_name(module)
    options: list[str] = []
    for line in result.output.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0] == "options" and kernel_name(fields[1]) == wanted:
            options += fields[2:]
    return options


def modprobe_base(root: HostRoot) -> list[str]:
    """modprobe reading the host's modules and the host's /etc/modprobe.d."""
    if root.is_bare:
        return ["modprobe"]
    return root.tool_argv("modprobe", "-C", str(root.local("/etc/modprobe.d")))


def modules_dir_writable(root: HostRoot, kernel: str) -> bool:
    """Whether the host's /lib/modules/<kernel> takes our module files, so a load goes through
    modprobe (otherwise insmod from the cache)."""
    base = root.local_resolved(f"/lib/modules/{kernel}")
    return base.is_dir() and os.access(base, os.W_OK)


def depmod_argv(root: HostRoot, kernel: str) -> list[str]:
    """depmod for every module of `kernel` (depmod(8): -a is implied when no file is named)."""
    return root.tool_argv("depmod", kernel)


class LoadRequest(NamedTuple):
    kernel: str
    via_modprobe: bool
    module_dir: Path
    user_args: dict[str, list[str]]


def load(root: HostRoot, runner: Runner, request: LoadRequest) -> None:
    """Load nvidia, nvidia-uvm, nvidia-modeset (those not loaded yet) with the host's
    modprobe.d options plus the user's arguments. Raises ModuleLoadFailed."""
    present = loaded_modules(root)
    for module in LOAD_ORDER:
        if kernel_name(module) not in present:
            load_module(root, runner, request, module)


def load_module(root: HostRoot, runner: Runner, request: LoadRequest, module: str) -> None:
    """Load one module of the driver (modprobe, else insmod of its .ko in `request.module_dir`
    with the host's modprobe.d options) plus the user's arguments. Raises ModuleLoadFailed
    with what the kernel logged."""
    from installer.host import kmsg

    args = request.user_args.get(kernel_name(module), [])
    if request.via_modprobe:
        argv = [*modprobe_base(root), module, *args]
    else:
        options = modprobe_options(root, runner, module)
        argv = ["insmod", str(request.module_dir / f"{module}.ko"), *options, *args]
    with kmsg.watching() as kernel_log:
        try:
            runner.run(argv, timeout=120)
        except CommandFailed as exc:
            # The kernel's own reason (NVRM: No NVIDIA GPU found., ...): modprobe's error
            # alone does not say why.
            said = kernel_log.lines()
            kernel = ("; the kernel logged: " + " | ".join(said)) if said else ""
            raise ModuleLoadFailed(
                f"loading {module} failed: {exc.output_tail.strip() or exc.message}"
                + kernel,
                hint=_load_hint(exc.output_tail + "\n" + "\n".join(said)),
            ) from exc
    log.info("loaded %s", module)


def _load_hint(output: str) -> str:
    lowered = output.lower()
    if "no nvidia gpu found" in lowered:
        return ("The driver found no NVIDIA GPU it can drive on this node (PCI): check that the "
                "GPU is attached and visible (lspci), or install ahead of attaching GPUs with "
                "NVIDIA_INSTALLER_ALLOW_NO_GPU=true (nothing is loaded then).")
    if "no such device" in lowered:
        return ("The kernel found no GPU this driver supports: check the GPUs (`installer plan`) "
                "and that the version supports them; dmesg names the reason.")
    if "key was rejected" in lowered or "required key not available" in lowered:
        return ("Secure Boot rejected the module: set NVIDIA_MODULE_SIGNING_KEY and "
                "NVIDIA_MODULE_SIGNING_CERT to a key enrolled in the node's MOK list.")
    return "See the kernel log (dmesg) on the node for the reason the module was rejected."


def unload(root: HostRoot, runner: Runner, holders: Sequence[str]) -> None:
    """Unload every NVIDIA module in reverse dependency order. Raises DriverInUse when a
    module is held (the still-loaded driver keeps working)."""
    present = loaded_modules(root)
    busy = [name for name in UNLOAD_ORDER if present.get(name, 0) > 0]
    if holders or busy:
        raise in_use_error(holders, present)
    for name in UNLOAD_ORDER:
        if name not in present:
            continue
        try:
            runner.run(["rmmod", name], timeout=60)
        except CommandFailed as exc:
            raise in_use_error(holders, loaded_modules(root), exc.output_tail) from exc
        log.info("unloaded %s", name)


def in_use_error(holders: Sequence[str], present: dict[str, int], detail: str = "") -> DriverInUse:
    users = [f"{n} (refcount {c})" for n, c in present.items() if n.startswith("nvidia") and c]
    parts = ["the loaded NVIDIA driver is in use and cannot be replaced"]
    if holders:
        parts.append("processes holding /dev/nvidia*: " + "; ".join(holders))
    if users:
        parts.append("modules in use: " + ", ".join(users))
    if detail.strip():
        parts.append(detail.strip())
    return DriverInUse("; ".join(parts))


class Node(NamedTuple):
    name: str
    major: int
    minor: int


def expected_nodes(root: HostRoot, gpu_count: int) -> list[Node]:
    nodes = [Node("nvidiactl", NVIDIA_MAJOR, 255), Node("nvidia-modeset", NVIDIA_MAJOR, 254)]
    nodes += [Node(f"nvidia{i}", NVIDIA_MAJOR, i) for i in range(gpu_count)]
    uvm = uvm_major(root)
    if uvm is not None:
        nodes += [Node("nvidia-uvm", uvm, 0), Node("nvidia-uvm-tools", uvm, 1)]
    return nodes


def uvm_major(root: HostRoot) -> int | None:
    text = root.read_text("/proc/devices") or ""
    match = re.search(r"^\s*(\d+)\s+nvidia-uvm\s*$", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def missing_nodes(dev_dir: Path, nodes: Sequence[Node]) -> list[str]:
    missing = []
    for node in nodes:
        try:
            info = os.stat(dev_dir / node.name)
        except OSError:
            missing.append(node.name)
            continue
        if not stat.S_ISCHR(info.st_mode) or (os.major(info.st_rdev), os.minor(info.st_rdev)) != (
            node.major,
            node.minor,
        ):
            missing.append(node.name)
    return missing


def nvidia_modprobe_argvs(binary: Path, gpu_count: int) -> list[list[str]]:
    """nvidia-modprobe makes one kind of node per call: `-c=N` /dev/nvidiaN (255 is
    nvidiactl), `-m` /dev/nvidia-modeset, and with `-u` the minor names the uvm node
    (`-u -c=0` makes /dev/nvidia-uvm and /dev/nvidia-uvm-tools)."""
    argvs = [[str(binary), f"-c={index}"] for index in range(gpu_count)]
    argvs.append([str(binary), "-c=255"])
    argvs.append([str(binary), "-m"])
    argvs.append([str(binary), "-u", "-c=0"])
    return argvs


def create_nodes(runner: Runner, binary: Path, gpu_count: int, env: dict[str, str]) -> None:
    for argv in nvidia_modprobe_argvs(binary, gpu_count):
        try:
            runner.run(argv, env=env, timeout=60)
        except CommandFailed as exc:
            raise DeviceNodesFailed(f"`{' '.join(argv)}` failed: {exc.output_tail}") from exc


def char_link(dev_dir: Path, node: Node) -> Path:
    return dev_dir / "char" / f"{node.major}:{node.minor}"


def missing_char_links(dev_dir: Path, nodes: Sequence[Node]) -> list[str]:
    """Nodes without their /dev/char/<major>:<minor> link (what udev adds for kernel-made
    nodes; runc's systemd cgroup driver resolves devices through it)."""
    return [n.name for n in nodes if os.path.realpath(char_link(dev_dir, n))
            != os.path.realpath(dev_dir / n.name)]


def link_char_nodes(dev_dir: Path, nodes: Sequence[Node]) -> None:
    """/dev/char/<major>:<minor> -> ../<node> for each node, replaced atomically."""
    (dev_dir / "char").mkdir(exist_ok=True)
    for node in nodes:
        link = char_link(dev_dir, node)
        temporary = link.with_name(f".{link.name}.tmp")
        if temporary.is_symlink():
            temporary.unlink()
        os.symlink(f"../{node.name}", temporary)
        os.replace(temporary, link)


NODE_NAME = r"nvidia(\d+|ctl|-modeset|-uvm|-uvm-tools)"


def remove_nodes(dev_dir: Path) -> list[str]:
    """Remove the device nodes nvidia-modprobe makes and their /dev/char links. Returns the
    removed paths."""
    removed = []
    char_dir = dev_dir / "char"
    for link in sorted(char_dir.iterdir()) if char_dir.is_dir() else []:
        if link.is_symlink() and re.fullmatch(NODE_NAME, os.readlink(link).rpartition("/")[2]):
            link.unlink()
            removed.append(str(link))
    for path in sorted(dev_dir.glob("nvidia*")):
        if re.fullmatch(NODE_NAME, path.name) and stat.S_ISCHR(path.lstat().st_mode):
            path.unlink()
            removed.append(str(path))
    return removed


def ko_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.ko"))
