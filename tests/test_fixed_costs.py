"""Fixed costs of an idle process (issue 9): what no longer runs or loads when there is little to do,
and that retention and the commands still work without it.

* The custom-series garbage collector's cadence follows the store's size (SeriesStore.gc_interval):
  an empty or small store is visited every min(retention / 10, 30 s), not every second; retention
  is still enforced, also on a store that was empty when the loop started.
* `kcms <command>` builds only that command's flags: `kcms standalone` no longer imports the agent,
  the simulator or the HA clients (nor, for `--help` or a bad flag, the Kubernetes client library).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from kcms.cmd.main import COMMANDS, build_parser
from kcms.model import ObjectRef
from kcms.store.series import GC_MAX_INTERVAL, GC_MIN_INTERVAL, SeriesStore
from kcms.tasks import cancel_and_wait


async def eventually(cond, limit: float) -> None:
    """Poll a condition nothing signals (a liveness check with a generous limit, not a timing goal)."""
    deadline = time.monotonic() + limit
    while not cond() and time.monotonic() < deadline:  # noqa: ASYNC110 (nothing signals it)
        await asyncio.sleep(0.1)


def pod(name: str) -> ObjectRef:
    return ObjectRef("pods", "default", name)


def store(retention: float) -> SeriesStore:
    return SeriesStore(retention=retention, stale_after=retention, default_window=retention)


def test_gc_interval_follows_the_store_size():
    s = store(600)
    assert s.gc_interval() == GC_MAX_INTERVAL == 30.0  # empty: one wake-up every 30 s, not every second
    t = time.time()
    for i in range(25):
        s.append("m", pod(f"p{i}"), (), t, 1.0)
    assert s.gc_interval() == 30.0  # one step of the default budget covers it
    assert s.gc_interval(budget=10) == 10.0  # three steps per 30 s pass
    for i in range(25, 1000):
        s.append("m", pod(f"p{i}"), (), t, 1.0)
    assert s.gc_interval(budget=10) == GC_MIN_INTERVAL  # 100 steps: never more than one a second
    # every series expired: collected, and the cadence is back to the idle one
    while s.stats()["series"]:
        s.collect_garbage(now=t + 601, budget=10)
    assert s.stats() == {"series": 0, "points": 0, "metrics": 0}
    assert s.gc_interval(budget=10) == 30.0
    # a short retention is visited every second, as before
    assert store(5).gc_interval() == GC_MIN_INTERVAL
    assert store(100).gc_interval() == 10.0


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 3_000_000),
    retention=st.floats(1.0, 86_400.0),
    budget=st.integers(1, 100_000),
)
def test_gc_interval_bounds_a_pass(n: int, retention: float, budget: int):
    """Whatever the size: at most one step a second, at least one per 30 s, and a whole pass within
    min(retention / 10, 30 s) unless that needs more than one step a second (then a step a second)."""
    s = store(retention)
    s._n_series = n  # the size is all gc_interval reads; filling 3 M series here would take minutes
    interval = s.gc_interval(budget)
    assert GC_MIN_INTERVAL <= interval <= GC_MAX_INTERVAL
    steps = max(1, -(-n // budget))
    pass_seconds = min(retention / 10, GC_MAX_INTERVAL)
    assert steps * interval <= max(pass_seconds, steps * GC_MIN_INTERVAL) * (1 + 1e-9)


async def test_the_gc_loop_collects_a_store_that_becomes_non_empty():
    """The loop starts over an empty store (its longest sleep), then series arrive: the expired ones
    are removed from every index and discovery, the fresh ones kept until they expire too."""
    s = store(6.0)  # retention 6 s: a step a second
    task = asyncio.create_task(s.collect_garbage_forever())
    try:
        await asyncio.sleep(1.5)  # let it take a step over the empty store
        assert not task.done()
        now = time.time()
        s.append("old", pod("a"), (), now - 5.5, 1.0)  # expires in 0.5 s
        s.append("old", pod("a"), (("k", "v"),), now - 5.5, 1.0)
        s.append("fresh", pod("b"), (), now, 2.0)  # expires in 6 s
        assert s.stats()["series"] == 3
        assert {m for _, m in s.metrics()} == {"old", "fresh"}
        await eventually(lambda: s.stats()["series"] < 3, 60)
        # the expired ones went first, the fresh one is still served
        assert s.stats()["series"] == 1, s.stats()
        assert [m for _, m in s.metrics()] == ["fresh"]
        assert s.query("pods", "default", ["b"], "fresh", now=time.time())
        await eventually(lambda: s.stats()["series"] == 0, 60)
        assert s.stats() == {"series": 0, "points": 0, "metrics": 0}
        assert s.metrics() == []
        assert not task.done()  # it goes on
    finally:
        await cancel_and_wait(task)
    assert task.cancelled()


# ------------------------------------------------------------------ imports at start

UNUSED_BY_STANDALONE = ("kcms.agent", "kcms.sim", "kcms.cmd.flags_ha", "kcms.cmd.demo")


def _modules_after(code: str) -> tuple[set[str], str]:
    """Run ``code`` in a fresh interpreter; the modules it left loaded and its stderr."""
    script = code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split()), out.stderr


def test_standalone_startup_does_not_import_other_commands_modules():
    """The parse and the whole pipeline module of `kcms standalone`: no agent, simulator, HA client."""
    modules, _ = _modules_after(
        "from kcms.cmd.main import build_parser\n"
        "args = build_parser('standalone').parse_args(['standalone', '--metric-resolution', '15s'])\n"
        "assert args.metric_resolution == 15.0 and args.command == 'standalone'\n"
        "import kcms.cmd.standalone\n"
    )
    assert [m for m in modules if m.startswith(UNUSED_BY_STANDALONE)] == []
    assert "kcms.cmd.standalone" in modules
    # nor cryptography: client certificates are told apart by OpenSSL's verified chain, and a
    # self-signed serving certificate is made by a child (kcms/certs.py)
    assert [m for m in modules if m.startswith("cryptography")] == []


def test_standalone_help_and_bad_flags_load_no_kubernetes_client():
    """`kcms standalone --help` and a refused flag answer without importing kubernetes_asyncio (it was
    imported through the agent's flags), and still say what they said before."""
    for argv, code, text in (
        (["standalone", "--help"], 0, "--metric-resolution"),
        (
            ["standalone", "--metric-resolution", "5s"],
            2,
            "argument --metric-resolution: must be at least 10s",
        ),
    ):
        modules, err = _modules_after(
            "import contextlib, io, sys\n"
            "from kcms.cmd.main import main\n"
            "buf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):\n"
            "    try:\n"
            f"        main({argv!r})\n"
            "    except SystemExit as e:\n"
            f"        assert e.code == {code}, (e.code, buf.getvalue())\n"
            f"assert {text!r} in buf.getvalue(), buf.getvalue()\n"
        )
        assert not [m for m in modules if m.startswith(("kubernetes_asyncio", *UNUSED_BY_STANDALONE))], argv
        assert "Traceback" not in err


def test_each_command_still_gets_its_whole_parser():
    """Every command parses its own flags as the full parser does; the full parser (no command)
    still has every command's flags, and the top-level help lists every command."""
    full = build_parser()
    samples = {
        "standalone": ["--metric-resolution", "20s", "--agent-selector", "app=a"],
        "store": ["--series-retention", "5m"],
        "collector": ["--kubelet-port", "1234"],
        "server": ["--series-retention", "5m"],
        "agent": ["--node-name", "n1"],
        "simulate": ["--nodes", "7"],
        "demo": ["--nodes", "2"],
    }
    assert set(samples) == set(COMMANDS)
    for command, flags in samples.items():
        one = vars(build_parser(command).parse_args([command, *flags]))
        assert one == vars(full.parse_args([command, *flags])), command
    top = full.format_help()
    assert all(c in top for c in COMMANDS)
    assert all(c in build_parser("standalone").format_help() for c in COMMANDS)
