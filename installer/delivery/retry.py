"""Retries of transient failures with jittered exponential backoff (tenacity)."""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Callable, TypeVar

from installer.delivery.settings import DownloadSettings
from installer.delivery.transport import Transient, Unreachable
from installer.errors import DownloadFailed

if TYPE_CHECKING:
    import tenacity

log = logging.getLogger("installer.download")
T = TypeVar("T")


def backoff_delay(settings: DownloadSettings, attempt: int) -> float:
    """The pause after failed attempt number `attempt` (1-based), jittered."""
    base = min(settings.backoff_max, settings.backoff_initial * 2.0 ** (attempt - 1))
    # Half fixed, half random: nodes that failed together do not retry together.
    return base / 2 + random.uniform(0, base / 2)


def with_retries(
    fn: Callable[[], T], settings: DownloadSettings, what: str, *, next_source: bool = False
) -> T:
    """Calls `fn` until it stops raising Transient, with jittered exponential backoff.

    With `next_source` (a mirror list goes on), Unreachable is raised at once: the caller
    tries its next mirror and retries the list, not this one source.
    """
    import tenacity

    attempts = settings.retries + 1

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if (
            isinstance(exc, Transient)
            and exc.retry_after is not None
            and exc.retry_after <= settings.retry_after_max
        ):
            return exc.retry_after
        return backoff_delay(settings, state.attempt_number)

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "%s: attempt %d of %d failed: %s; retrying in %.1f s",
            what,
            state.attempt_number,
            attempts,
            exc,
            delay,
        )

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=wait,
        retry=tenacity.retry_if_exception(
            lambda exc: isinstance(exc, Transient)
            and not (next_source and isinstance(exc, Unreachable))
        ),
        before_sleep=before_sleep,
        reraise=True,
    )
    try:
        return retrying(fn)
    except Transient as exc:
        if next_source and isinstance(exc, Unreachable):
            raise
        raise DownloadFailed(f"{what}: {exc} (gave up after {attempts} attempts)") from None


