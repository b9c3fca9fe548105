"""Store scale-out benchmark: standalone vs multi-store vs sharded `kcms store` processes on loopback.

    python bench/scaleout.py                    # 10 s per mode, 2 writers, 10 000 pods x 5 metrics
    python bench/scaleout.py --quick            # smoke run, well under a minute
    python bench/scaleout.py --seconds 30 --writers 3 --batch 5000 --pods 10000

Modes (every store is its own `python -m kcms store` process on 127.0.0.1, plain HTTP, a shared
bearer token, static membership):

  standalone  : 1 store (N=1, R=W=1);
  multi-store : 3 stores, every store holds everything (--replicas 0; R=2, W=2);
  sharded     : 4 stores, --replicas 2 (each key on 2 stores; R=1, W=2).

Load, the same in every mode: --writers processes, each with its own StoreCluster, write custom
samples of 5 metrics about --pods distinct pods (10 namespaces of up to 1 000 pods; each writer has
its own share of the pods, so every sample is newer than its series' last point) in batches of
--batch samples, one batch in flight per writer, as fast as the stores acknowledge. A first pass
creates every series before the clock starts. The figure is acknowledged samples per second (a
sample counts once, however many stores hold it) summed over the writers over --seconds.

Then, while writer 0 keeps ingesting, this process queries through its own StoreCluster: a
named-object query (one pod) and a wildcard query of a whole namespace (1 000 pods), latest value.
Latency is the whole client path: encode, HTTP, decode, quorum merge.

For reference it first times, in this process on one core, SeriesStore.append_many (no HTTP, no
codec) and a store's handling of a write body (wire.decode + StoreService.apply, no HTTP).
Prints figures and ratios; asserts nothing. The machine's cores are shared by every store and
writer process, so more stores than cores cannot scale ingestion.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import multiprocessing as mp
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import psutil

import kcms
from kcms.kube.members import Member, StaticMembers
from kcms.model import ObjectRef
from kcms.store import wire
from kcms.store.cluster import REPAIRS, StoreCluster, default_quorum
from kcms.store.resource import ResourceStore
from kcms.store.series import SeriesStore
from kcms.store.service import StoreService

TOKEN = "scaleout-bench-token"
METRICS = ["app_queue_depth", "app_requests_total", "app_latency_seconds", "app_errors_total", "app_inflight"]
PODS_PER_NAMESPACE = 1000
REPO = Path(kcms.__file__).resolve().parent.parent


def pod_refs(pods: int) -> list[ObjectRef]:
    return [ObjectRef("pods", f"ns-{i // PODS_PER_NAMESPACE}", f"pod-{i}") for i in range(pods)]


def batches(keys: list[tuple[str, ObjectRef]], size: int, value: float, ts: float):
    """One pass over ``keys`` at timestamp ``ts``, in samples lists of ``size``."""
    for i in range(0, len(keys), size):
        yield [(m, o, (), ts, value) for m, o in keys[i : i + size]]


def my_keys(pods: int, writer: int, writers: int) -> list[tuple[str, ObjectRef]]:
    mine = [o for i, o in enumerate(pod_refs(pods)) if i % writers == writer]
    return [(m, o) for m in METRICS for o in mine]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In a store child: get SIGTERM when the bench dies, even by SIGKILL (Linux prctl)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class StoreProcs:
    """``n`` `kcms store` processes s0..s{n-1} with static membership and a shared token file."""

    def __init__(self, tmp: Path, n: int, replicas: int) -> None:
        self.tmp = tmp
        self.replicas = replicas
        self.token_file = tmp / "token"
        self.token_file.write_text(TOKEN + "\n")
        self.ports = {f"s{i}": free_port() for i in range(n)}
        self.procs: dict[str, subprocess.Popen] = {}

    def members(self) -> list[Member]:
        return [Member(name, f"http://127.0.0.1:{port}") for name, port in sorted(self.ports.items())]

    def start(self, timeout: float = 30.0) -> None:
        endpoints = ",".join(f"{m.name}={m.url}" for m in self.members())
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        for name, port in self.ports.items():
            with open(self.tmp / f"{name}.log", "wb") as log:
                cmd = [
                    sys.executable, "-m", "kcms", "store", "--bind-address=127.0.0.1", f"--port={port}",
                    f"--token-file={self.token_file}", f"--store-name={name}", f"--store-endpoints={endpoints}",
                    f"--replicas={self.replicas}", "--refill-timeout=5s",
                ]  # fmt: skip
                # In their own session: Ctrl-C reaches the bench only, and the bench stops the stores.
                self.procs[name] = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent,
                    start_new_session=True,
                )  # fmt: skip
        deadline = time.monotonic() + timeout
        for name in self.ports:
            while not self._ready(name):
                if self.procs[name].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"store {name} did not become ready:\n{self.log(name)}")
                time.sleep(0.05)

    def _get(self, name: str, path: str, auth: bool = False) -> bytes:
        req = urllib.request.Request(f"http://127.0.0.1:{self.ports[name]}{path}")
        if auth:
            req.add_header("Authorization", "Bearer " + TOKEN)
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.read()

    def _ready(self, name: str) -> bool:
        try:
            return self._get(name, "/readyz") == b"ok"
        except OSError:
            return False

    def series(self) -> dict[str, int]:
        return {
            n: orjson.loads(self._get(n, "/store/v1/status", auth=True))["series"]["series"]
            for n in self.ports
        }

    def accepted(self) -> float:
        """Samples the stores stored (``kcms_store_samples_total{outcome="accepted"}``, summed)."""
        total = 0.0
        for n in self.ports:
            m = re.search(
                rb'^kcms_store_samples_total\{outcome="accepted"\} (\S+)$', self._get(n, "/metrics"), re.M
            )
            total += float(m.group(1)) if m else 0.0
        return total

    def cpu(self) -> float:
        total = 0.0
        for proc in self.procs.values():
            with contextlib.suppress(psutil.Error):
                t = psutil.Process(proc.pid).cpu_times()
                total += t.user + t.system
        return total

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def cluster(members: list[Member], replicas: int) -> StoreCluster:
    return StoreCluster(
        StaticMembers(members), replicas=replicas, token=lambda: TOKEN, timeout=10.0, retries=0
    )


@dataclass
class WriterArgs:
    index: int
    writers: int
    members: list[Member]
    replicas: int
    pods: int
    batch: int
    seconds: float
    linger: bool  # keep ingesting after --seconds until stopped (writer 0, during queries)


def writer_main(a: WriterArgs, start, stop, results) -> None:
    """A writer process: one pass to create the series, "ready", wait for ``start``, write for
    ``a.seconds`` and put the figures on ``results``; with ``a.linger``, go on until ``stop``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench process stops us
    asyncio.run(_writer(a, start, stop, results))


async def _writer(a: WriterArgs, start, stop, results) -> None:
    keys = my_keys(a.pods, a.index, a.writers)
    c = cluster(a.members, a.replicas)
    loop = asyncio.get_running_loop()
    last_ts = 0.0
    value = 0.0
    total = 0  # acknowledged samples over the writer's whole life

    async def one_pass(until: float | None) -> tuple[int, int, list[str]]:
        nonlocal last_ts, value, total
        last_ts = max(time.time(), last_ts + 0.001)
        value += 1.0
        acked = failed = 0
        errors: list[str] = []
        for samples in batches(keys, a.batch, value, last_ts):
            r = await c.write(samples=samples)
            acked += r.acked_samples
            total += r.acked_samples
            failed += r.failed_samples
            errors.extend(r.errors[:1])
            if until is not None and time.monotonic() >= until:
                break
        return acked, failed, errors

    try:
        await one_pass(None)  # creates every series
        results.put(("ready", a.index))
        await loop.run_in_executor(None, start.wait)
        t0, cpu0 = time.monotonic(), time.process_time()
        acked = failed = 0
        errors: list[str] = []
        while time.monotonic() - t0 < a.seconds:
            n, f, e = await one_pass(t0 + a.seconds)
            acked, failed = acked + n, failed + f
            errors.extend(e[:3])
        elapsed = time.monotonic() - t0
        results.put(("done", a.index, acked, failed, elapsed, time.process_time() - cpu0, errors[:3]))
        if a.linger:
            t1, acked = time.monotonic(), 0
            while not stop.is_set():
                acked += (await one_pass(None))[0]
            results.put(("linger", a.index, acked, time.monotonic() - t1))
        results.put(("end", a.index, total))
    finally:
        await c.close()


@dataclass
class Outcome:
    mode: str
    stores: int
    replicas: int
    rate: float = 0.0
    failed: int = 0
    named: list[float] = field(default_factory=list)
    wild: list[float] = field(default_factory=list)
    misses: int = 0
    linger_rate: float = 0.0
    notes: list[str] = field(default_factory=list)


async def query_phase(members: list[Member], replicas: int, args: argparse.Namespace, out: Outcome) -> None:
    """Named and wildcard queries, interleaved, until both counts are reached (or 60 s)."""
    c = cluster(members, replicas)
    refs = pod_refs(args.pods)
    namespaces = sorted({o.namespace for o in refs})
    per_ns = {ns: sum(o.namespace == ns for o in refs) for ns in namespaces}
    repairs0 = REPAIRS._value.get()
    try:
        deadline = time.monotonic() + 60.0
        i = 0
        while (len(out.named) < args.named or len(out.wild) < args.wildcard) and time.monotonic() < deadline:
            i += 1
            metric = METRICS[i % len(METRICS)]
            if len(out.named) < args.named:
                o = refs[(i * 7919) % len(refs)]
                t = time.perf_counter()
                res = await c.query_series("pods", o.namespace, [o.name], metric)
                out.named.append(time.perf_counter() - t)
                out.misses += len(res) != 1
            if len(out.wild) < args.wildcard and i % max(1, args.named // max(1, args.wildcard)) == 0:
                ns = namespaces[i % len(namespaces)]
                t = time.perf_counter()
                res = await c.query_series("pods", ns, None, metric)
                out.wild.append(time.perf_counter() - t)
                out.misses += len(res) != per_ns[ns]
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)  # let read repairs started by the queries finish before counting
    finally:
        await c.close()
    repaired = REPAIRS._value.get() - repairs0
    if repaired:
        out.notes.append(f"read repair copied {repaired:.0f} keys between stores during the queries")


def receive(results, procs: list, timeout: float) -> tuple:
    """The next writer message; RuntimeError when a writer died or nothing came within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return results.get(timeout=0.5)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"writer process exited with code {dead[0].exitcode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"no word from the writers within {timeout:.0f} s") from None


def run_mode(mode: str, n: int, replicas: int, args: argparse.Namespace, tmp: Path) -> Outcome:
    out = Outcome(mode, n, replicas)
    (tmp / mode).mkdir()
    stores = StoreProcs(tmp / mode, n, replicas)
    ctx = mp.get_context("spawn")
    start, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    procs: list = []
    try:
        stores.start()
        members = stores.members()
        for i in range(args.writers):
            wa = WriterArgs(i, args.writers, members, replicas, args.pods, args.batch, args.seconds, i == 0)
            p = ctx.Process(target=writer_main, args=(wa, start, stop, results), daemon=True)
            p.start()
            procs.append(p)
        ready = 0
        while ready < args.writers:
            ready += receive(results, procs, 120)[0] == "ready"
        cpu0, t0 = stores.cpu(), time.monotonic()
        start.set()
        done, later = [], []  # later: "linger" and "end" messages that came in meanwhile
        while len(done) < args.writers:
            msg = receive(results, procs, args.seconds + 120)
            (done if msg[0] == "done" else later).append(msg)
        wall = time.monotonic() - t0
        store_cpu = stores.cpu() - cpu0
        out.rate = sum(m[2] / m[4] for m in done)
        out.failed = sum(m[3] for m in done)
        writer_cpu = sum(m[5] for m in done)
        for m in done:
            for e in m[6]:
                out.notes.append(f"writer {m[1]} error: {e[:200]}")
        out.notes.append(
            f"cpu during ingestion: stores {store_cpu:.1f} s, writers {writer_cpu:.1f} s "
            f"of {os.cpu_count()} cores x {wall:.1f} s = {(os.cpu_count() or 1) * wall:.1f} s"
        )
        asyncio.run(query_phase(members, replicas, args, out))
        stop.set()
        acked = ended = 0
        while ended < args.writers:  # one "end" per writer
            msg = later.pop(0) if later else receive(results, procs, 60)
            if msg[0] == "linger":
                out.linger_rate = msg[2] / msg[3]
            elif msg[0] == "end":
                acked += msg[2]
                ended += 1
        copies = n if replicas == 0 else min(replicas, n)
        stored = stores.accepted()
        out.notes.append(
            f"stores stored {stored:,.0f} samples = {stored / max(1, acked * copies):.3f} x "
            f"acknowledged ({acked:,}) x copies ({copies})"
        )
        held = stores.series()
        expected = args.pods * len(METRICS)
        out.notes.append(
            "series held: "
            + ", ".join(f"{k} {v:,}" for k, v in held.items())
            + f" ({sum(held.values()) / expected:.2f} copies of {expected:,})"
        )
    finally:
        stop.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)
        stores.stop()
    return out


def in_process(args: argparse.Namespace, service: bool, collect: bool = True) -> float:
    """Samples/s in this process, after a first pass created the series: SeriesStore.append_many,
    or (``service``) what a store does with a write body: wire.decode + StoreService.apply; with
    ``collect=False`` the cyclic garbage collector is off. This process's own long-lived objects are
    frozen (``gc.freeze``) so that collections see about what a store process holds."""
    keys = [(m, o) for m in METRICS for o in pod_refs(args.pods)]
    svc = StoreService("bench", ResourceStore(15.0), SeriesStore(), lambda: TOKEN)
    n, spent, value, ts = 0, 0.0, 0.0, time.time()
    deadline = time.monotonic() + min(args.seconds, 3.0)
    gc.collect()
    gc.freeze()
    if not collect:
        gc.disable()
    try:
        while n == 0 or time.monotonic() < deadline:
            ts, value = ts + 0.001, value + 1.0
            for b in batches(keys, args.batch, value, ts):
                data = wire.encode(wire.Write(samples=wire.samples_to_wire(b))) if service else b
                t = time.perf_counter()
                if service:
                    accepted = svc.apply(wire.decode(data, wire.Write)).samples
                else:
                    accepted = svc.series.append_many(data)
                if value > 1.0:  # the first pass creates the series: not timed
                    n += accepted
                    spent += time.perf_counter() - t
    finally:
        gc.enable()
        gc.unfreeze()
    return n / spent


def ms(x: float) -> str:
    return f"{x * 1e3:.1f}" if x >= 0.01 else f"{x * 1e3:.2f}"


def report(outcomes: list[Outcome], args: argparse.Namespace) -> None:
    base = outcomes[0]
    print()
    head = (
        f"{'mode':<12} {'stores':>6} {'R/W':>4} {'ingest/s':>10} {'x std':>6}  {'named p50':>9} {'p99':>7}"
        f" {'x std':>6}  {'wild p50':>8} {'p99':>7} {'x std':>6}  {'ingest/s while queried':>22}"
    )
    print(head)
    print("-" * len(head))
    for o in outcomes:
        r, w = default_quorum(o.stores if o.replicas == 0 else min(o.replicas, o.stores))
        print(
            f"{o.mode:<12} {o.stores:>6} {f'{r}/{w}':>4} {o.rate:>10,.0f} {o.rate / base.rate:>5.2f}x"
            f"  {ms(pct(o.named, 50)):>9} {ms(pct(o.named, 99)):>7} {pct(o.named, 99) / pct(base.named, 99):>5.2f}x"
            f"  {ms(pct(o.wild, 50)):>8} {ms(pct(o.wild, 99)):>7} {pct(o.wild, 99) / pct(base.wild, 99):>5.2f}x"
            f"  {o.linger_rate:>22,.0f}"
        )
    print("(latencies in ms; x std = ratio to standalone; named/wildcard: n = "
          f"{len(base.named)}/{len(base.wild)} per mode, one writer still ingesting)")  # fmt: skip
    for o in outcomes:
        for note in o.notes:
            print(f"  {o.mode}: {note}")
        if o.failed:
            print(f"  {o.mode}: WARNING {o.failed:,} samples not acknowledged by a write quorum")
        if o.misses:
            print(f"  {o.mode}: WARNING {o.misses} queries returned the wrong number of series")
    sharded = next((o for o in outcomes if o.mode == "sharded"), None)
    if sharded is not None and base.mode == "standalone":
        cores = os.cpu_count()
        print(
            f"\nsharded {sharded.stores} stores vs 1 store: ingestion {sharded.rate / base.rate:.2f}x "
            f"(the issue's target: 2.5x). This machine has os.cpu_count() = {cores} core(s): the "
            f"{sharded.stores} store processes and {args.writers} writer processes share them, so "
            "sharding cannot add CPU here; with replicas=2 every sample is also stored twice."
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="ingestion time per mode (default 10)")
    ap.add_argument("--writers", type=int, default=2, help="writer processes (default 2)")
    ap.add_argument("--batch", type=int, default=5000, help="samples per write (default 5 000)")
    ap.add_argument("--pods", type=int, default=10_000, help="distinct pods (default 10 000; x 5 metrics)")
    ap.add_argument("--named", type=int, default=300, help="named-object queries per mode (default 300)")
    ap.add_argument(
        "--wildcard", type=int, default=100, help="1000-pod wildcard queries per mode (default 100)"
    )
    ap.add_argument("--quick", action="store_true", help="short smoke run (2 s per mode, 2 000 pods)")
    ap.add_argument(
        "--modes",
        default="standalone,multi-store,sharded",
        help="modes to run, comma-separated (standalone first: the ratios are to it)",
    )
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.pods, args.batch, args.named, args.wildcard = 2.0, 2000, 2000, 40, 10
    if args.writers < 1 or args.batch < 1 or args.pods < 1:
        ap.error("--writers, --batch and --pods must be positive")

    # SIGTERM like Ctrl-C: unwind through the finally blocks that stop the stores and writers.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(
        f"load: {args.writers} writer process(es), {args.pods:,} pods x {len(METRICS)} metrics = "
        f"{args.pods * len(METRICS):,} series, batches of {args.batch:,} samples, {args.seconds:g} s per mode; "
        f"{os.cpu_count()} CPU core(s)"
    )
    print(
        f"in-process, one core, no HTTP: SeriesStore.append_many {in_process(args, False):,.0f} samples/s; "
        f"wire.decode + StoreService.apply {in_process(args, True):,.0f} samples/s, "
        f"{in_process(args, True, collect=False):,.0f} with the cyclic GC off"
    )
    known = {"standalone": (1, 0), "multi-store": (3, 0), "sharded": (4, 2)}
    modes = [(m, *known[m]) for m in args.modes.split(",") if m in known]
    if not modes:
        ap.error(f"--modes: pick from {', '.join(known)}")
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="kcms-scaleout-") as tmp:
        for mode, n, replicas in modes:
            t = time.monotonic()
            o = run_mode(mode, n, replicas, args, Path(tmp))
            outcomes.append(o)
            print(
                f"{mode:<12}: {n} store(s), {o.rate:,.0f} acknowledged samples/s, "
                f"{time.monotonic() - t:.0f} s for the mode"
            )
    report(outcomes, args)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted: stores and writers stopped", file=sys.stderr)
        sys.exit(130)
