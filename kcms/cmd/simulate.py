"""``kcms simulate``: run simulated kubelets until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from kcms.sim.cluster import SimulatedCluster
from kcms.sim.workload import node_addresses


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``kcms simulate`` flags to ``parser``."""
    parser.add_argument("--nodes", default="3", help="number of simulated nodes (default 3)")
    parser.add_argument("--pods-per-node", default="5", help="running pods per node (default 5)")
    parser.add_argument(
        "--containers-per-pod", default="1-3", help='containers per pod, "N" or a range "LO-HI" (default 1-3)'
    )
    parser.add_argument(
        "--address-base", default="127.1.0.1", help="address of the first node; the next ones count up"
    )
    parser.add_argument("--port", default="10250", help="kubelet port of every node (default 10250)")
    parser.add_argument(
        "--one-port-per-node",
        action="store_true",
        help="serve every node on 127.0.0.1 with its own ephemeral port instead",
    )
    parser.add_argument("--seed", default="1", help="random seed of the workload (default 1)")
    parser.add_argument(
        "--restart-every", default=None, help="mean seconds between restarts of a container (default: never)"
    )
    parser.add_argument(
        "--write-inventory", metavar="PATH", default=None, help="write Nodes and Pods as a v1 List"
    )
    parser.add_argument("--ca-out", metavar="PATH", default=None, help="write the CA certificate (PEM) here")
    parser.add_argument("--token", default=None, help="require this bearer token on every request")
    parser.add_argument(
        "--non-running-pods", action="store_true", help="add Pending/Succeeded pods to the inventory"
    )
    parser.add_argument(
        "--agents",
        action="store_true",
        help="also run a simulated `kcms agent` per node (application metrics of its pods, node gauges), "
        "each on 127.0.0.1 with its own port, printed as `agent <node> <host:port>`",
    )


class _FlagError(ValueError):
    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")


def _int(flag: str, value: object, lo: int, hi: int | None = None) -> int:
    try:
        n = int(str(value))
    except ValueError:
        raise _FlagError(flag, f"not an integer: {value!r}") from None
    if n < lo or (hi is not None and n > hi):
        bound = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise _FlagError(flag, f"must be {bound}, got {n}")
    return n


def parse_containers(value: str) -> tuple[int, int]:
    """Parse ``--containers-per-pod``: "2" or "1-3"."""
    flag = "--containers-per-pod"
    text = str(value).strip()
    lo_s, sep, hi_s = text.partition("-")
    lo = _int(flag, lo_s, 1, 100)
    hi = _int(flag, hi_s, 1, 100) if sep else lo
    if hi < lo:
        raise _FlagError(flag, f"range {text!r} is empty")
    return lo, hi


def cluster_from_args(args: argparse.Namespace) -> SimulatedCluster:
    """Validate the flags and build (not start) the cluster; raises ValueError naming the bad flag."""
    nodes = _int("--nodes", args.nodes, 1, 100000)
    pods = _int("--pods-per-node", args.pods_per_node, 0, 10000)
    containers = parse_containers(args.containers_per_pod)
    port = _int("--port", args.port, 0 if args.one_port_per_node else 1, 65535)
    seed = _int("--seed", args.seed, 0)
    restart = None
    if args.restart_every is not None:
        try:
            restart = float(args.restart_every)
        except ValueError:
            raise _FlagError("--restart-every", f"not a number: {args.restart_every!r}") from None
        if not restart > 0 or restart == float("inf"):
            raise _FlagError(
                "--restart-every", f"must be a positive number of seconds, got {args.restart_every}"
            )
    if not args.one_port_per_node:
        try:
            node_addresses(args.address_base, nodes)
        except ValueError as e:
            raise _FlagError("--address-base", str(e)) from None
        if not args.address_base.startswith("127."):
            raise _FlagError("--address-base", "must be a loopback address (127.x.y.z)")
    if args.token is not None and (not args.token or any(ch.isspace() for ch in args.token)):
        raise _FlagError("--token", "must be non-empty and contain no whitespace")
    for flag, path in (("--write-inventory", args.write_inventory), ("--ca-out", args.ca_out)):
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise _FlagError(flag, f"directory of {path!r} does not exist")
    return SimulatedCluster(
        nodes=nodes,
        pods_per_node=pods,
        containers_per_pod=containers,
        seed=seed,
        address_base=args.address_base,
        port=port,
        one_port_per_node=args.one_port_per_node,
        restart_every=restart,
        token=args.token,
        non_running_pods=getattr(args, "non_running_pods", False),
    )


def _write_outputs(cluster: SimulatedCluster, args: argparse.Namespace) -> None:
    if args.ca_out:
        Path(args.ca_out).write_bytes(cluster.ca_pem)
    if args.write_inventory:
        cluster.write_inventory(args.write_inventory)


async def simulate_main(args: argparse.Namespace) -> int:
    """Run ``kcms simulate``: start the cluster, print its URLs, write files, wait for a signal."""
    try:
        cluster = cluster_from_args(args)
    except ValueError as e:
        print(f"kcms simulate: error: {e}", file=sys.stderr)
        return 2
    try:
        await cluster.start()
    except OSError as e:
        print(f"kcms simulate: error: {e}", file=sys.stderr)
        return 1
    agents = None
    if getattr(args, "agents", False):
        from kcms.sim.agents import SimulatedAgents

        agents = SimulatedAgents(cluster, history=10.0)
    try:
        await asyncio.to_thread(_write_outputs, cluster, args)
        names = cluster.node_names()
        shown = names if len(names) <= 10 else names[:3]
        for name in shown:
            print(f"{name} {cluster.node_url(name)}", flush=True)
        if len(names) > 10:
            first, last = cluster.node_url(names[0]), cluster.node_url(names[-1])
            print(f"... {len(names)} nodes in all, {first} .. {last}", flush=True)
        if agents is not None:
            await agents.start()
            for name, target in agents.targets():
                print(f"agent {name} {target}", flush=True)
        pods = sum(len(n.pods) for n in cluster.nodes)
        print(f"serving {len(names)} simulated kubelets, {pods} pods; Ctrl-C to stop", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
    finally:
        if agents is not None:
            await agents.stop()
        await cluster.stop()
    return 0
