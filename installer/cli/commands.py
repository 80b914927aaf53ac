"""The click commands behind `installer`: one flag per setting (the environment is the
fallback), one command per job and per registered component; click's own errors and an
interrupt become exit codes here, the installer's in the door (`installer.cli`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from installer import __version__
from installer.cli.options import make_config
from installer.config import SETTINGS
from installer.errors import VerificationFailed

F = TypeVar("F", bound=Callable[..., Any])


def settings_options(func: F) -> F:
    """Add one flag per setting; the environment variable is the fallback (shown in --help)."""
    for setting in reversed(SETTINGS):
        if setting.secret:  # a flag's value shows in `ps`; environment or file only
            continue
        if setting.flag_is_switch:
            option = click.option(setting.flag, setting.name, is_flag=True, default=None,
                                  help=f"{setting.help} [env {setting.env}]")
        else:
            option = click.option(setting.flag, setting.name, default=None, metavar="VALUE",
                                  help=f"{setting.help} [env {setting.env}; default "
                                  f"{setting.default or 'unset'}]")
        func = option(func)
    verbose = click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
    return verbose(func)  # type: ignore[no-any-return]


class InstallerGroup(click.Group):
    """The commands below, plus one per registered component (`installer fabricmanager`,
    `installer persistenced`: components.COMPONENTS), made when asked for, so the other
    commands never import installer.components."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        from installer import components

        return sorted({*super().list_commands(ctx), *components.commands()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        from installer import components

        try:
            component = components.named(cmd_name)
        except KeyError:
            return None
        return component_command(component.name, component.summary)


def component_command(name: str, summary: str) -> click.Command:
    """`installer <name>`: the component's long-running container command."""

    @settings_options
    def serve(**options: Any) -> None:
        from installer import components

        config = make_config(options)
        components.serve(name, config)

    return click.Command(name, callback=serve, params=getattr(serve, "__click_params__", []),
                         help=summary, context_settings={"help_option_names": ["-h", "--help"]})


@click.group(cls=InstallerGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="installer")
def cli() -> None:
    """Install a verified NVIDIA driver onto this node (or the host mounted at ROOT_MOUNT_DIR)."""


@cli.command()
@settings_options
def run(**options: Any) -> None:
    """Install the planned driver, load it, create device nodes, verify (idempotent)."""
    from installer import app

    config = make_config(options)
    app.run(config)


@cli.command()
@settings_options
def plan(**options: Any) -> None:
    """Print host facts, every decision with its reason, and the steps `run` would take."""
    from installer import app

    config = make_config(options)
    for line in app.describe_plan(app.build_plan(config)):
        click.echo(line)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@settings_options
def verify(as_json: bool, **options: Any) -> None:
    """Check the loaded driver with nvidia-smi and NVML against the install record."""
    from installer import app

    config = make_config(options)
    report = app.verify_installed(config)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        for line in report.summary_lines():
            click.echo(line)
    if not report.ok:
        raise VerificationFailed("verification failed: " + "; ".join(report.problems))


@cli.command()
@settings_options
def status(**options: Any) -> None:
    """Print the install record, the loaded driver and readiness as JSON."""
    from installer import app

    config = make_config(options)
    click.echo(json.dumps(app.status(config), indent=2, sort_keys=True))


@cli.command()
@settings_options
def versions(**options: Any) -> None:
    """List the version catalog (branches, types, releases)."""
    from installer import app

    config = make_config(options)
    for line in app.list_versions(config):
        click.echo(line)


@cli.command()
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory to download into (e.g. a mirror's <version>/ dir).")
@click.option("--arch", type=click.Choice(["x86_64", "aarch64"]), default="x86_64",
              show_default=True)
@settings_options
def download(dest: Path, arch: str, **options: Any) -> None:
    """Prefetch the .run for a version (air-gapped nodes, mirrors)."""
    # not app: the planner and its steps are not needed here
    from installer.release import download as release_download

    config = make_config(options)
    path = release_download.download_runfile(config, dest, arch)
    click.echo(str(path))


@cli.command()
@click.option("--kernel", "kernel_release_", required=True, metavar="RELEASE",
              help="Kernel release to build for (need not be running; its headers must be "
              "found as on a node).")
@click.option("--push", is_flag=True, help="Publish the modules to NVIDIA_MODULE_REGISTRY.")
@click.option("--arch", type=click.Choice(["x86_64", "aarch64"]), default=None,
              help="The kernel's architecture (default: this machine's); another one is "
              "cross-compiled (an x86 builder making arm64 modules).")
@settings_options
def prebuild(kernel_release_: str, push: bool, arch: str | None, **options: Any) -> None:
    """Compile the modules for a kernel ahead of time (CI, a Job before a node-pool upgrade)."""
    from installer import app

    options["kernel_release"] = kernel_release_
    if push:
        options["module_registry_push"] = True
    config = make_config(options)
    click.echo(app.prebuild(config, arch=arch))


@cli.command("prepare-next-kernel")
@click.option("--watch", is_flag=True, help="Keep looking every --interval seconds (a "
              "DaemonSet container): a kernel installed later is prepared before the reboot.")
@click.option("--interval", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Seconds between looks with --watch.")
@settings_options
def prepare_next_kernel(watch: bool, interval: float, **options: Any) -> None:
    """Modules of the installed driver for a newer installed kernel, into the cache before the
    reboot into it."""
    from installer import app

    config = make_config(options)
    click.echo(app.prepare_next_kernel(config, interval if watch else None))


@cli.command()
@settings_options
def uninstall(**options: Any) -> None:
    """Unload the driver and remove everything the installer put on the host."""
    from installer import app

    config = make_config(options)
    for item in app.uninstall(config):
        click.echo(f"removed {item}")


@cli.command()
@settings_options
def gate(**options: Any) -> None:
    """Keep this node's scheduling gate in step with its readiness (the scheduling-gate
    container): untaint once the driver and what it needs are up, taint again when they stay
    down (NVIDIA_INSTALLER_GATE_CLOSE_AFTER)."""
    from installer import app

    config = make_config(options)
    app.serve_gate(config)


@cli.command()
@click.option("--listen", default=":9402", show_default=True,
              help="[host]:port to serve /metrics on (`:PORT`: every IPv4 address of the host; "
              "the DaemonSet gives the node's own address, `[$(HOST_IP)]:9402`).")
@click.option("--access", type=click.Choice(["open", "tokenreview"]), default="open",
              show_default=True,
              help="open: any client reads /metrics; tokenreview: only a bearer token the API "
              "server authenticates (TokenReview) whose user may get the non-resource URL "
              "/metrics (SubjectAccessReview).")
@click.option("--max-connections", type=click.IntRange(min=1), default=64, show_default=True,
              help="Open connections held at most (the oldest still sending its request makes "
              "room for a new one).")
@click.option("--client-timeout", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True, help="Seconds a client has to send its whole request.")
@click.option("--nvml-interval", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds between NVML questions (fabric state, persistence mode).")
@settings_options
def metrics(listen: str, access: str, max_connections: int, client_timeout: float,
            nvml_interval: float, **options: Any) -> None:
    """Serve Prometheus metrics of this node's driver (the metrics container): ready, version,
    install time by phase, failures by reference, fabric, daemons, the next kernel."""
    from installer.metrics import serve

    config = make_config(options)
    serve(config, listen, nvml_interval, access=access, max_connections=max_connections,
          read_timeout=client_timeout)


def main(args: list[str]) -> None:
    """Run the command `args` name; click's usage errors and an interrupt exit here."""
    try:
        cli.main(args=args, prog_name="installer", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
