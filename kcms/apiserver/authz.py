"""Delegated authorization: always-allow paths and groups, then an access reviewer
(SubjectAccessReview, cached there), and kube's wording for the 403 answer."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from kcms.limits import printable
from kcms.model import RequestAttributes, UserInfo

from .responses import StatusError, forbidden, service_unavailable

log = logging.getLogger(__name__)


class AccessAuthorizer(Protocol):
    """Anything that decides a request (e.g. ``kcms.kube.reviews.AccessReviewer``)."""

    async def authorize(self, user: UserInfo, attrs: RequestAttributes) -> tuple[bool, str]: ...


@dataclass(slots=True)
class AuthzOptions:
    """Authorization settings (the kube ``--authorization-always-allow-paths`` etc.).

    A path ending in ``*`` is a prefix. ``allow_all`` (demos only) allows every authenticated request.
    ``handler_authorized_paths`` (exact paths) require authentication only: their handler authorizes
    each item it is asked to do (the metric push decides per target, ``kcms.apis.pushauth``).
    """

    access_reviewer: AccessAuthorizer | None = None
    always_allow_paths: list[str] = field(default_factory=lambda: ["/healthz", "/readyz", "/livez"])
    always_allow_groups: list[str] = field(default_factory=lambda: ["system:masters"])
    allow_all: bool = False
    handler_authorized_paths: list[str] = field(default_factory=list)


def path_always_allowed(path: str, patterns: list[str]) -> bool:
    """Whether ``path`` matches one of the always-allow patterns (exact, or prefix with ``*``)."""
    for p in patterns:
        if p.endswith("*"):
            if path.startswith(p[:-1]):
                return True
        elif path == p:
            return True
    return False


def forbidden_message(user: UserInfo, attrs: RequestAttributes) -> str:
    """kube's explanation of a denial, without the ``... is forbidden:`` head."""
    if not attrs.resource_request:
        return f'User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
    resource = attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else "")
    if attrs.namespace:
        return (
            f'User "{user.name}" cannot {attrs.verb} resource "{resource}" in API group '
            f'"{attrs.api_group}" in the namespace "{attrs.namespace}"'
        )
    return (
        f'User "{user.name}" cannot {attrs.verb} resource "{resource}" in API group '
        f'"{attrs.api_group}" at the cluster scope'
    )


def forbidden_error(user: UserInfo, attrs: RequestAttributes, reason: str) -> StatusError:
    """The 403 ``Status`` kube answers for a denied request."""
    msg = forbidden_message(user, attrs)
    if reason:
        msg = f"{msg}: {reason}"
    if not attrs.resource_request:
        return forbidden("", "", "", msg)
    return forbidden(attrs.api_group, attrs.resource, attrs.name, msg)


class Authorizer:
    """Decides requests: allow-all, privileged groups, then the access reviewer (deny if none)."""

    def __init__(self, opts: AuthzOptions) -> None:
        self.opts = opts
        self._groups = set(opts.always_allow_groups)

    def always_allowed_path(self, path: str) -> bool:
        """Whether the path skips authentication failures and authorization."""
        return path_always_allowed(path, self.opts.always_allow_paths)

    def handler_authorizes(self, path: str) -> bool:
        """Whether the path's handler authorizes its request itself (authentication still required)."""
        return path in self.opts.handler_authorized_paths

    async def authorize(self, user: UserInfo, attrs: RequestAttributes) -> tuple[bool, str]:
        """(allowed, reason); raises a 503 :class:`StatusError` when the reviewer fails."""
        if self.opts.allow_all:
            return True, "allow-all"
        if self._groups.intersection(user.groups):
            return True, "privileged group"
        if self.opts.access_reviewer is None:
            return False, "no authorizer configured"
        try:
            return await self.opts.access_reviewer.authorize(user, attrs)
        except Exception as e:  # the review could not be made (kube-apiserver down, own token unreadable)
            # kube answers 500; a dependency being unavailable is not a server bug: 503, retry later
            log.error("access review failed: %s", printable(e, 200))
            raise service_unavailable(f"authorization check failed: {printable(e, 200)}") from e
