"""A recording Runner for unit tests: answers by argv prefix, remembers every call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Callable, Union

from installer.errors import CommandFailed
from installer.runner import Result

Answer = Union[Result, Callable[[Sequence[str]], Result]]


@dataclass
class Call:
    argv: list[str]
    env: dict[str, str]


@dataclass
class FakeRunner:
    answers: list[tuple[tuple[str, ...], Answer]] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)

    def on(
        self,
        *prefix: str,
        output: str = "",
        returncode: int = 0,
        effect: Callable[[Sequence[str]], None] | None = None,
    ) -> FakeRunner:
        def answer(argv: Sequence[str]) -> Result:
            if effect is not None:
                effect(argv)
            return Result(tuple(argv), returncode, output)

        self.answers.append((prefix, answer))
        return self

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
        args = [str(a) for a in argv]
        self.calls.append(Call(args, dict(env or {})))
        for prefix, answer in reversed(self.answers):
            if tuple(args[: len(prefix)]) == prefix:
                result = answer(args) if callable(answer) else answer
                break
        else:
            raise AssertionError(f"unexpected command: {args}")
        if check and result.returncode != 0:
            raise CommandFailed(args, result.returncode, result.tail())
        return result

    def argvs(self) -> list[list[str]]:
        return [c.argv for c in self.calls]
