"""Running one `kubectl kcms` command: connect, run, print; failures as one stderr line, exit code 1.

With ``--watch`` the command runs again every ``--interval``: on a terminal the screen is cleared first
(as `watch` does), otherwise the prints follow each other separated by a blank line. A failure after
the first print is reported (one line, with the time) and the next round tries again; warnings are
printed again only when they change; Ctrl-C or SIGTERM ends the watch with exit code 0.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from typing import Any

from kcms.kubectl.client import PluginError, connect, one_line

CLEAR = "\x1b[H\x1b[2J"


def run(args: argparse.Namespace) -> int:
    if args.command == "dashboard":
        from kcms.kubectl.dashboard import run_dashboard

        return _guard(lambda: run_dashboard(args))
    return _guard(lambda: asyncio.run(_run(args)))


def _guard(fn: Any) -> int:
    try:
        return fn()
    except PluginError as e:
        print(f"error: {e}" if not str(e).startswith("Error from server") else str(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `kubectl kcms top pods | head`: the reader is gone, not an error
        import os

        # stdout's buffer would fail again when the interpreter flushes it at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


async def _run(args: argparse.Namespace) -> int:
    api = await connect(args.kubeconfig, args.context, args.request_timeout)
    async with api:
        if args.command == "top":
            from kcms.kubectl import top

            command = top.top_nodes if args.what == "nodes" else top.top_pods
            if args.watch:
                return await _watch(lambda: command(api, args), args)
            top.print_result(await command(api, args), args)
            return 0
        if args.command == "metrics":
            from kcms.kubectl.metrics import list_metrics

            return await list_metrics(api, args)
        if args.command == "get":
            from kcms.kubectl.get import get_metric

            return await get_metric(api, args)
    raise PluginError(f"unknown command {args.command}")


async def _watch(once: Any, args: argparse.Namespace) -> int:
    from kcms.kubectl import top

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tty = sys.stdout.isatty()
    first = True
    last_warnings: list[str] = []
    while not stop.is_set():
        try:
            result = await once()
        except PluginError as e:
            if first:
                raise
            print(f"{time.strftime('%H:%M:%S')} error: {e}", file=sys.stderr, flush=True)
        else:
            if result.warnings == last_warnings:
                result.warnings = []  # said once; said again only when they change
            else:
                last_warnings = list(result.warnings)
            if tty:
                sys.stdout.write(CLEAR)
            elif not first:
                sys.stdout.write("\n")
            top.print_result(result, args)
            sys.stdout.flush()
            first = False
        try:
            await asyncio.wait_for(stop.wait(), args.interval)
        except TimeoutError:
            pass
    return 0


def warn(text: str) -> None:
    print(f"warning: {one_line(text)}", file=sys.stderr)
