"""A dnf plan on a Rocky host tree without a process: the plan, its decisions and steps, NVIDIA's
repo file, rpm's answers and dnf's cached module metadata."""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path

from kit.rpm import DEFAULT_SPEC, RepoSpec, modules_yaml

from installer import planner
from installer.config import from_env
from installer.plan import Plan, Step
from installer.runner import Result
from lib.fakes import FakeRunner
from lib.hosttrees import make_host, root_env

KERNEL = "5.14.0-427.13.1.el9_4.x86_64"


def plan_for(
    tmp_path: Path, runner: FakeRunner, distro: str = "rocky-9", kernel: str = KERNEL, **env: str
) -> Plan:
    make_host(tmp_path, distro=distro, kernel=kernel, gpus=[0x2330])
    config = from_env(root_env(tmp_path, **env))

    def no_fetch(*args: object) -> Path:
        raise AssertionError("no download expected")

    return planner.make_plan(config, runner, fetch_bytes=lambda url: b"", fetch_runfile=no_fetch)  # type: ignore[arg-type]


def decision(plan: Plan, topic: str) -> tuple[str, str]:
    found = next(d for d in plan.decisions if d.topic == topic)
    return found.value, found.reason


def step(plan: Plan, name: str) -> Step:
    return next(s for s in plan.steps if s.name == name)


def add_repo_file(root: Path, name: str = "cuda-rhel9.repo") -> None:
    repos = root / "etc/yum.repos.d"
    repos.mkdir(parents=True, exist_ok=True)
    (repos / name).write_text(
        "[cuda-rhel9-x86_64]\n"
        "baseurl=https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64\n"
        "enabled=1\ngpgcheck=1\n"
        "gpgkey=https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/D42D0685.pub\n"
    )


def rpm_answer(installed: dict[str, str]) -> FakeRunner:
    def answer(argv: Sequence[str]) -> Result:
        names = argv[argv.index("--qf") + 2 :] if "--qf" in argv else argv[argv.index("-q") + 1 :]
        lines = [
            f"{n} {installed[n]}" if n in installed else f"package {n} is not installed"
            for n in names
        ]
        code = 0 if all(n in installed for n in names) else 1
        return Result(tuple(argv), code, "\n".join(lines) + "\n")

    runner = FakeRunner()
    runner.answers.append((("rpm",), answer))
    return runner


def cache_metadata(root: Path, spec: RepoSpec = DEFAULT_SPEC) -> None:
    """The modules.yaml dnf caches for the kit's repo, gzipped as createrepo_c writes it."""
    repodata = root / "var/lib/nvidia/cache/dnf/cuda-rhel9-x86_64-1f2e3d4c5b6a7980/repodata"
    repodata.mkdir(parents=True, exist_ok=True)
    with gzip.open(repodata / "0123abcd-modules.yaml.gz", "wt") as handle:
        handle.write(modules_yaml(spec))
