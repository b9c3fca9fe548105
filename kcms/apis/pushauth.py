"""Per-target authorization of pushed samples: a push may write a metric only where RBAC would let
its sender write it, decided the way a read of the same metric is decided.

A sample's *target* is (metric, group-resource, namespace, name). It is authorized with a
SubjectAccessReview carrying resource attributes, verb ``create``:

- about a Kubernetes object (``resource`` is a group-resource such as ``pods`` or
  ``deployments.apps``): group ``custom.metrics.k8s.io``, resource = the group-resource, name = the
  object's name, subresource = the metric, namespace = the object's namespace (none for
  cluster-scoped objects) — the attributes of a read of
  ``/apis/custom.metrics.k8s.io/v1beta2/namespaces/<ns>/<resource>/<name>/<metric>``, with the
  write verb. An RBAC rule names it ``resources: ["pods/queue_depth"]`` (or ``["pods/*"]``, ``["*"]``);
- an external metric (``resource`` ""): group ``external.metrics.k8s.io``, resource = the metric,
  namespace — as a read of ``/apis/external.metrics.k8s.io/v1beta1/namespaces/<ns>/<metric>``.

Each distinct target is decided once per push (the reviewer caches and de-duplicates across pushes
and reads). When one push names at least ``probe_min_names`` objects of the same resource and metric
in one namespace, the review is first asked without a name (an empty name means "all names" to the
authorizer); if that is allowed, no per-name review is needed. Reviews run a few at a time; after
the first failed review (API server unreachable), the remaining targets of the push are refused as
``authorization_error`` without asking, so an outage costs a handful of attempts per push. At most
``max_reviews`` reviews are asked for one push (probes included): the targets beyond are refused as
``too_many_targets``, so one request cannot turn into thousands of reviews for the API server (a
push about many objects that a Role grants without ``resourceNames`` needs one probe, not a review
per object).

The legacy grant — the non-resource ``post`` on the push path, which lets its holder write any
target — counts only when ``allow_nonresource_grant`` is set (``--push-allow-nonresource-grant``).
The server's ``Authorizer`` in front of the reviewer still allows ``system:masters`` (and everything
in allow-all demo mode) without a review.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

from prometheus_client import Counter

from kcms.apiserver.authz import AccessAuthorizer, forbidden_message
from kcms.limits import printable
from kcms.model import RequestAttributes, UserInfo

log = logging.getLogger(__name__)

CUSTOM_GROUP = "custom.metrics.k8s.io"
EXTERNAL_GROUP = "external.metrics.k8s.io"
VERB = "create"

# Refusal reasons (stable: Prometheus label values and answer keys).
FORBIDDEN = "forbidden"
AUTHORIZATION_ERROR = "authorization_error"
TOO_MANY_TARGETS = "too_many_targets"

Target = tuple[str, str, str, str]  # (metric, resource, namespace, name)

DECISIONS = Counter(
    "kcms_push_authorizations",
    "Per-target authorization decisions of pushes (allowed, denied, error, too_many_targets), and "
    "pushes let through whole by the legacy non-resource grant (nonresource_grant).",
    ["decision"],
)


def target_attributes(target: Target, path: str, *, all_names: bool = False) -> RequestAttributes:
    """The attributes of writing ``target`` (``all_names``: of writing every object of its resource
    in its namespace)."""
    metric, resource, namespace, name = target
    if not resource:
        return RequestAttributes(
            verb=VERB,
            path=path,
            resource_request=True,
            api_group=EXTERNAL_GROUP,
            resource=metric,
            namespace=namespace,
        )
    return RequestAttributes(
        verb=VERB,
        path=path,
        resource_request=True,
        api_group=CUSTOM_GROUP,
        resource=resource,
        subresource=metric,
        namespace=namespace,
        name="" if all_names else name,
    )


class TargetAuthorizer:
    """Decides which targets of a push its sender may write (see the module docstring)."""

    def __init__(
        self,
        authorizer: AccessAuthorizer | None,
        *,
        path: str,
        allow_nonresource_grant: bool = False,
        concurrency: int = 8,
        probe_min_names: int = 4,
        max_reviews: int = 1000,
    ) -> None:
        """``authorizer``: the API server's ``Authorizer`` (privileged groups, then the cached
        SubjectAccessReview reviewer); None refuses every target."""
        self.authorizer = authorizer
        self.path = path
        self.allow_nonresource_grant = allow_nonresource_grant
        self.concurrency = max(1, concurrency)
        self.probe_min_names = max(2, probe_min_names)
        self.max_reviews = max(1, max_reviews)

    async def refusals(self, user: UserInfo, targets: Collection[Target]) -> dict[Target, tuple[str, str]]:
        """``{target: (reason, message)}`` for the targets ``user`` may not write; the others may be."""
        if not targets:
            return {}
        if self.authorizer is None:
            return dict.fromkeys(targets, (FORBIDDEN, "no authorizer is configured for pushes"))
        if self.allow_nonresource_grant and await self._nonresource_grant(user):
            DECISIONS.labels("nonresource_grant").inc()
            return {}

        # objects of one resource and metric in one namespace, for the "all names" probe
        groups: dict[tuple[str, str, str], list[Target]] = {}
        for t in targets:
            if t[1]:
                groups.setdefault(t[:3], []).append(t)
        probes = [ts for ts in groups.values() if len(ts) >= self.probe_min_names][: self.max_reviews]
        pending = set(targets)
        out: dict[Target, tuple[str, str]] = {}
        if probes:
            attrs = [target_attributes(ts[0], self.path, all_names=True) for ts in probes]
            answers, error = await self._ask(user, attrs)
            for ts, answer in zip(probes, answers, strict=True):
                if answer is True:
                    pending.difference_update(ts)
                    DECISIONS.labels("allowed").inc(len(ts))
            if error is not None:  # no point asking per name now
                return self._failed(user, pending, out, error)
        ordered = sorted(pending)  # the same order every time: reproducible answers and logs
        budget = self.max_reviews - len(probes)
        if len(ordered) > budget:
            over = ordered[budget:]
            ordered = ordered[:budget]
            pending.difference_update(over)
            DECISIONS.labels("too_many_targets").inc(len(over))
            message = (
                f"this push needs more than {self.max_reviews} access reviews; send fewer distinct targets "
                "per push, or get a grant without resourceNames for the objects of one resource and metric"
            )
            for t in over:
                out[t] = (TOO_MANY_TARGETS, message)
        answers, error = await self._ask(user, [target_attributes(t, self.path) for t in ordered])
        denied = 0
        for t, answer in zip(ordered, answers, strict=True):
            if answer is True:
                DECISIONS.labels("allowed").inc()
                pending.discard(t)
            elif answer is False:
                denied += 1
                DECISIONS.labels("denied").inc()
                pending.discard(t)
                out[t] = (FORBIDDEN, forbidden_message(user, target_attributes(t, self.path)))
        if denied:
            first = next(t for t in ordered if t in out)
            log.info(
                "push: %s may not write %d of %d targets, e.g. metric %s of %s %s/%s",
                printable(user.name, 80),
                denied,
                len(targets),
                printable(first[0], 80),
                printable(first[1] or "external", 80),
                printable(first[2], 80),
                printable(first[3], 80),
            )
        if error is not None:
            return self._failed(user, pending, out, error)
        return out

    def _failed(
        self, user: UserInfo, pending: Collection[Target], out: dict[Target, tuple[str, str]], error: str
    ) -> dict[Target, tuple[str, str]]:
        """Refuse the undecided targets: their review could not be made."""
        DECISIONS.labels("error").inc(len(pending))
        log.warning(
            "push: authorization of %d targets of %s could not be decided: %s",
            len(pending),
            printable(user.name, 80),
            printable(error, 200),
        )
        # the failure comes from the API server or the connection to it, not from the request: shown
        # as is (bounded) to the pusher, escaped in the log line above
        message = f"the access review could not be made ({error[:300]}); retry later"
        for t in pending:
            out[t] = (AUTHORIZATION_ERROR, message)
        return out

    async def _nonresource_grant(self, user: UserInfo) -> bool:
        """Whether ``user`` holds the legacy non-resource ``post`` on the push path (False on error:
        the per-target checks then decide, and fail alike if the API server is down)."""
        assert self.authorizer is not None
        attrs = RequestAttributes(verb="post", path=self.path, resource_request=False)
        try:
            allowed, _ = await self.authorizer.authorize(user, attrs)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of the review is "not granted"
            log.warning("push: review of the non-resource grant failed: %s", printable(str(e), 200))
            return False
        return allowed

    async def _ask(
        self, user: UserInfo, attrs: list[RequestAttributes]
    ) -> tuple[list[bool | None], str | None]:
        """Each review's answer (None: not decided), a few at a time; after the first failure the
        rest are not asked. Returns the answers and the first failure's text (or None)."""
        assert self.authorizer is not None
        authorizer = self.authorizer
        answers: list[bool | None] = [None] * len(attrs)
        failure: list[str] = []
        work = iter(enumerate(attrs))

        async def worker() -> None:
            for i, a in work:  # one shared iterator: each review is asked once
                if failure:
                    return
                try:
                    allowed, _ = await authorizer.authorize(user, a)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - a failed review refuses its targets, not the push
                    failure.append(_error_text(e))
                    return
                answers[i] = bool(allowed)

        await asyncio.gather(*(worker() for _ in range(min(self.concurrency, len(attrs)))))
        return answers, (failure[0] if failure else None)


def _error_text(e: Exception) -> str:
    """What went wrong, without the 500 wrapping the server's ``Authorizer`` puts around it."""
    causes = (getattr(e, "details", None) or {}).get("causes") or []
    if causes and isinstance(causes[0], dict) and causes[0].get("message"):
        return str(causes[0]["message"])
    return str(getattr(e, "message", "") or e) or type(e).__name__
