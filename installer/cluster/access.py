"""Who may read the metrics: a bearer token the API server authenticates (TokenReview) whose
user it authorizes for the non-resource URL (SubjectAccessReview), as kube-rbac-proxy checks
scrapers of node-level exporters; each answer kept briefly so a scrape every 30 s costs the
API server nothing after the first."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from installer.config import Config
from installer.errors import InstallerError

log = logging.getLogger(__name__)

# Seconds an answer is kept: a revoked binding or token stops working within this.
CACHE_SECONDS = 60.0
# Distinct tokens remembered (the oldest forgotten first): bounded whatever clients send.
CACHE_ENTRIES = 256


class Decision(NamedTuple):
    """The HTTP status for the request (200: admitted) and why, in words."""

    status: int
    reason: str


class Reviewer(Protocol):
    def token_review(self, token: str) -> dict[str, Any]: ...

    def subject_access_review(self, user: dict[str, Any], path: str,
                              verb: str) -> dict[str, Any]: ...


class ScrapeAccess:
    """`check(authorization)`: 401 without a token the API server authenticates, 403 when its
    user may not `verb` `path`, 503 when the API server cannot be asked (not kept), else 200."""

    def __init__(self, reviewer: Reviewer, path: str = "/metrics", verb: str = "get",
                 ttl: float = CACHE_SECONDS, entries: int = CACHE_ENTRIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.reviewer, self.path, self.verb = reviewer, path, verb
        self.ttl, self.entries, self.clock = ttl, entries, clock
        self.cache: OrderedDict[str, tuple[float, Decision]] = OrderedDict()
        self.lock = threading.Lock()

    def check(self, authorization: str | None) -> Decision:
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Decision(401, "a bearer token is required")
        # Kept by digest: the tokens themselves never stay in memory longer than a request.
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        with self.lock:
            kept = self.cache.get(key)
            if kept is not None and kept[0] > now:
                return kept[1]
        decision = self._review(token)
        if decision.status != 503:
            with self.lock:
                self.cache[key] = (now + self.ttl, decision)
                self.cache.move_to_end(key)
                while len(self.cache) > self.entries:
                    self.cache.popitem(last=False)
        return decision

    def _review(self, token: str) -> Decision:
        try:
            review = self.reviewer.token_review(token)
            status = review.get("status") or {}
            if status.get("authenticated") is not True:
                return Decision(401, "the API server does not authenticate this token")
            user = status.get("user") or {}
            if not isinstance(user, dict) or not user.get("username"):
                return Decision(401, "the API server named no user for this token")
            answer = self.reviewer.subject_access_review(user, self.path, self.verb)
        except InstallerError as exc:
            log.warning("metrics: cannot check a scraper's access: %s", exc)
            return Decision(503, "the API server cannot be asked who this is")
        if (answer.get("status") or {}).get("allowed") is True:
            return Decision(200, "")
        log.info("metrics: %s may not %s %s", user.get("username"), self.verb, self.path)
        return Decision(403, f"{user.get('username')} may not {self.verb} {self.path}")


def scrape_access(config: Config) -> ScrapeAccess:
    """The check with this pod's own credentials (its service account, or
    NVIDIA_INSTALLER_KUBECONFIG). Raises the credentials' errors when there are none."""
    from installer.cluster.client import NodeClient

    return ScrapeAccess(NodeClient(config.node_name or "", config.kubeconfig))
