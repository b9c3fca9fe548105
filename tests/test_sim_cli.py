"""The `kcms simulate` command line: flag validation, and the command serving real HTTPS until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from kcms.cmd.simulate import add_simulate_arguments, simulate_main


async def get(s: aiohttp.ClientSession, url: str, limit: float = 10.0) -> tuple[int, bytes]:
    async with s.get(url, timeout=aiohttp.ClientTimeout(total=limit)) as r:
        return r.status, await r.read()


# ----- command line ------------------------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_simulate_arguments(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--nodes", "0"], "--nodes"),
        (["--nodes", "many"], "--nodes"),
        (["--pods-per-node", "-1"], "--pods-per-node"),
        (["--containers-per-pod", "3-1"], "--containers-per-pod"),
        (["--containers-per-pod", "x"], "--containers-per-pod"),
        (["--port", "70000"], "--port"),
        (["--restart-every", "0"], "--restart-every"),
        (["--address-base", "10.0.0.1"], "--address-base"),
        (["--address-base", "127.1.2"], "--address-base"),
        (["--token", ""], "--token"),
        (["--ca-out", "/nonexistent-dir/ca.pem"], "--ca-out"),
    ],
)
async def test_bad_flags_exit_2_naming_the_flag(argv: list[str], flag: str, capsys) -> None:
    assert await simulate_main(_args(*argv)) == 2
    assert flag in capsys.readouterr().err


async def test_simulate_command_serves_until_sigterm(tmp_path: Path) -> None:
    ca_out, inv = tmp_path / "ca.pem", tmp_path / "inv.json"
    code = (
        "import argparse, asyncio, sys\n"
        "from kcms.cmd.simulate import add_simulate_arguments, simulate_main\n"
        "p = argparse.ArgumentParser(); add_simulate_arguments(p)\n"
        "sys.exit(asyncio.run(simulate_main(p.parse_args(sys.argv[1:]))))\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, "--nodes", "2", "--pods-per-node", "2", "--one-port-per-node",
        "--ca-out", str(ca_out), "--write-inventory", str(inv), "--token", "tok",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        lines = []
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            assert line, (await proc.stderr.read()).decode()
            lines.append(line)
            if line.startswith("serving"):
                break
        urls = [ln.split()[1] for ln in lines[:2]]
        ctx = ssl.create_default_context(cadata=ca_out.read_text())
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx), headers={"Authorization": "Bearer tok"}
        ) as s:
            for url in urls:
                status, body = await get(s, url + "/stats/summary")
                assert status == 200 and orjson.loads(body)["node"]["nodeName"]
        items = orjson.loads(inv.read_bytes())["items"]
        assert sum(1 for o in items if o["kind"] == "Node") == 2
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_simulate_agents_serve_the_agent_exposition() -> None:
    from kcms.sources.exposition import parse_exposition

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kcms", "simulate", "--nodes", "2", "--pods-per-node", "2", "--one-port-per-node",
        "--agents", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        agents = {}
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            assert line, (await proc.stderr.read()).decode()
            if line.startswith("agent "):
                _, node, target = line.split()
                agents[node] = target
            if line.startswith("serving"):
                break
        assert len(agents) == 2
        async with aiohttp.ClientSession() as s:
            for node, target in agents.items():
                status, body = await get(s, f"http://{target}/metrics?since=0")
                assert status == 200
                samples, rejected = parse_exposition(body)
                assert not rejected
                objects = {(obj.resource, obj.name) for _, obj, _, _, _ in samples}
                assert ("nodes", node) in objects
                assert any(resource == "pods" for resource, _ in objects)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
