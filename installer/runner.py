"""The only place that starts processes: argv lists, LC_ALL=C, timeouts, streamed output.
subprocess is imported when a process starts: a warm run starts none, so it never pays for it."""

from __future__ import annotations

import collections
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, NamedTuple, Protocol

from installer.errors import CommandFailed, CommandNotFound

if TYPE_CHECKING:
    import subprocess

log = logging.getLogger(__name__)

TAIL_LINES = 40
# Credentials registry tools read from the environment (oras, for one); dropped as well.
_FOREIGN_SECRETS = frozenset({"ORAS_USER", "ORAS_PASS"})


def child_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the registry credentials and without any URL-valued setting: make, the
    .run, nvidia-installer, apt-get, dnf and its scriptlets, dkms and the daemons never see
    them, whatever they run or log. A URL setting may carry a credential (a mirror's
    `user:password@`, a signed query) and no child reads the installer's settings, so every
    one whose value is a URL is dropped, not only those that look secret today."""
    from installer.config import known_env_vars, secret_env_vars

    dropped = secret_env_vars() | _FOREIGN_SECRETS
    settings = known_env_vars()
    return {k: v for k, v in env.items()
            if k not in dropped and not (k in settings and "://" in v)}


class Result(NamedTuple):
    argv: tuple[str, ...]
    returncode: int
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, lines: int = TAIL_LINES) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


class Runner(Protocol):
    """What runs a command: SubprocessRunner, or a test's stand-in (see its `run`)."""

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float | None = None,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            stream: bool = False, input_text: str | None = None) -> Result: ...


class SubprocessRunner:
    """Runs commands for real. `stream=True` logs each output line as it arrives."""

    def __init__(self, base_env: Mapping[str, str] | None = None) -> None:
        self._base_env = child_environment(os.environ if base_env is None else base_env)
        self._base_env["LC_ALL"] = "C"
        self.command_seconds = 0.0

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stream: bool = False,
        input_text: str | None = None,
    ) -> Result:
        import subprocess

        args = [str(a) for a in argv]
        full_env = child_environment({**self._base_env, **(env or {})})
        if shutil.which(args[0], path=full_env.get("PATH")) is None and not os.path.isfile(args[0]):
            raise CommandNotFound(f"command not found: {args[0]}")
        log.debug("run: %s", " ".join(args))
        try:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=cwd,
                text=True,
                errors="replace",
            )
        except FileNotFoundError as exc:
            raise CommandNotFound(f"command not found: {args[0]}") from exc
        started = time.monotonic()
        try:
            lines = _collect(proc, args[0], stream, input_text, timeout)
        finally:
            self.command_seconds += time.monotonic() - started
        result = Result(tuple(args), proc.returncode, "".join(lines))
        if check and not result.ok:
            raise CommandFailed(args, result.returncode, result.tail())
        return result


def _collect(
    proc: subprocess.Popen[str],
    name: str,
    stream: bool,
    input_text: str | None,
    timeout: float | None,
) -> list[str]:
    import subprocess

    lines: list[str] = []
    keep: collections.deque[str] = collections.deque(maxlen=10_000)
    label = os.path.basename(name)

    def pump(out: IO[str]) -> None:
        for line in out:
            keep.append(line)
            if stream:
                log.info("%s: %s", label, line.rstrip())

    assert proc.stdout is not None
    reader = threading.Thread(target=pump, args=(proc.stdout,), daemon=True)
    reader.start()
    if input_text is not None and proc.stdin is not None:
        proc.stdin.write(input_text)
        proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        reader.join(timeout=5)
        raise CommandFailed(
            [name], -9, "".join(list(keep)[-TAIL_LINES:]),
            message=f"`{name}` did not finish within {timeout:.0f} s and was killed",
        ) from None
    reader.join(timeout=30)
    lines.extend(keep)
    return lines


# --- long-running children: the daemons beside the driver ---------------------------------


class Child:
    """A started process: its output goes line by line to `on_line` (from a reader thread)."""

    def __init__(self, proc: subprocess.Popen[str], reader: threading.Thread) -> None:
        self._proc = proc
        self._reader = reader
        self.pid = proc.pid
        self.argv = tuple(str(a) for a in proc.args)  # type: ignore[union-attr]

    def poll(self) -> int | None:
        """The exit status (negative: killed by that signal) once it exited, else None."""
        code = self._proc.poll()
        if code is not None:
            self._reader.join(timeout=5)
        return code

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status, or None when it is still running after `timeout` seconds."""
        import subprocess

        try:
            code = self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(timeout=5)
        return code

    def send_signal(self, signum: int) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signum)

    def stop(self, timeout: float) -> None:
        """SIGTERM, and SIGKILL when it is still there after `timeout` seconds (a daemon the
        supervisor stops; nothing once it exited). With `poll` this makes a started daemon the
        supervisor's `Running`."""
        if self.poll() is not None:
            return
        self.send_signal(signal.SIGTERM)
        if self.wait(timeout) is None:
            log.warning("%s ignored SIGTERM for %.0f s: killing it",
                        os.path.basename(self.argv[0]), timeout)
            self.send_signal(signal.SIGKILL)
            self.wait(10)


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    base_env: Mapping[str, str] | None = None,
) -> Child:
    """Start `argv` without waiting (LC_ALL=C, stdin from /dev/null, stdout and stderr merged
    and handed to `on_line` without the newline), in an environment without credentials
    (child_environment). Raises CommandNotFound."""
    import subprocess

    args = [str(a) for a in argv]
    full_env = child_environment({**(os.environ if base_env is None else base_env),
                                  "LC_ALL": "C", **(env or {})})
    if shutil.which(args[0], path=full_env.get("PATH")) is None and not os.path.isfile(args[0]):
        raise CommandNotFound(f"command not found: {args[0]}")
    log.debug("spawn: %s", " ".join(args))
    try:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=full_env, text=True,
                                errors="replace")
    except (FileNotFoundError, PermissionError) as exc:
        raise CommandNotFound(f"cannot run {args[0]}: {exc.strerror or exc}") from exc
    handler = on_line or (lambda line: None)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            handler(line.rstrip("\n"))

    reader = threading.Thread(target=pump, name=f"output of {os.path.basename(args[0])}",
                              daemon=True)
    reader.start()
    return Child(proc, reader)
