"""Named health checks served on ``/healthz``, ``/livez`` and ``/readyz`` in kube's text format."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

log = logging.getLogger(__name__)

CheckFn = Callable[[], tuple[bool, str]]


@dataclass(slots=True)
class Check:
    """One named check and the endpoints it belongs to."""

    name: str
    fn: CheckFn
    livez: bool = True
    readyz: bool = True
    healthz: bool = True
    report: bool = False  # a passing check's detail is shown in ?verbose (else only a failure's)


class Health:
    """The checks of a server; ``shutting_down`` makes ``/readyz`` fail."""

    def __init__(self) -> None:
        self.checks: list[Check] = [Check("ping", lambda: (True, ""))]
        self.shutting_down = False

    def add(
        self, name: str, fn: CheckFn, *, livez: bool = True, readyz: bool = True, report: bool = False
    ) -> None:
        """Add (or replace) a named check; ``report``: show its detail in ``?verbose`` while it passes."""
        self.checks = [c for c in self.checks if c.name != name]
        self.checks.append(Check(name, fn, livez=livez, readyz=readyz, healthz=livez or readyz, report=report))

    def _selected(self, endpoint: str) -> list[Check]:
        out = [c for c in self.checks if getattr(c, endpoint)]
        if endpoint == "readyz":
            out.append(Check("shutdown", lambda: (not self.shutting_down, "process is shutting down")))
        return out

    @staticmethod
    def _run(check: Check) -> tuple[bool, str]:
        try:
            ok, detail = check.fn()
            return bool(ok), detail
        except Exception as e:  # a broken check is a failed check
            log.exception("health check %s raised", check.name)
            return False, f"check raised {type(e).__name__}: {e}"

    def handle(self, endpoint: str, request: web.Request, single: str | None = None) -> web.Response:
        """Answer ``/<endpoint>`` (all checks) or ``/<endpoint>/<single>`` (one check)."""
        checks = self._selected(endpoint)
        headers = {"Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff"}
        if single is not None:
            for c in checks:
                if c.name == single:
                    ok, detail = self._run(c)
                    if ok:
                        return web.Response(text="ok", headers=headers)
                    return web.Response(
                        text=f"internal server error: {detail}\n", status=500, headers=headers
                    )
            return web.Response(text="404 page not found\n", status=404, headers=headers)
        exclude = set(request.query.getall("exclude", []))
        verbose = "verbose" in request.query
        lines = []
        failed = []
        for c in checks:
            if c.name in exclude:
                lines.append(f"[+]{c.name} excluded: ok")
                continue
            ok, detail = self._run(c)
            if ok:  # kube's "[+]name ok"; a check that reports while passing adds its note
                shown = c.report and detail not in ("", "ok")
                lines.append(f"[+]{c.name} ok: {detail}" if shown else f"[+]{c.name} ok")
            else:
                lines.append(f"[-]{c.name} failed: {detail or 'reason withheld'}")
                failed.append(c.name)
        if failed:
            log.info("%s check failed: %s", endpoint, ", ".join(failed))
            body = "\n".join(lines) + f"\n{endpoint} check failed\n"
            return web.Response(text=body, status=500, headers=headers)
        if verbose:
            return web.Response(text="\n".join(lines) + f"\n{endpoint} check passed\n", headers=headers)
        return web.Response(text="ok", headers=headers)
