"""Store wire format benchmark: encode + decode time and bytes per sample, MessagePack vs JSON.

    python bench/wire.py                      # 10 000-sample write, 1 000-row query answer
    python bench/wire.py --samples 50000 --repeat 20

Three codecs of the same data, each on one core in this process:

  msgpack      : kcms.store.wire (msgspec MessagePack, ``array_like`` Structs), typed decode;
  msgpack-block: the same, samples as a ``SampleBlock`` (strings and label sets sent once, rows of
                 indexes): what collectors send; encode includes building the block;
  orjson       : orjson.dumps of the same tuples, orjson.loads plus converting the lists back to the
                 tuples the store wants (what a JSON decoder of this format would have to do; it
                 checks no types, so it does less than the typed decoders);
  msgspec-json : msgspec JSON with the same typed Structs (encode and typed decode).

Payloads:

  write : ``wire.Write(samples=...)``, samples ``(metric, resource, namespace, name, labels, ts,
          value)`` with 2-3 label pairs each, 10 metrics over 1 000 pods in 10 namespaces;
  query : the answer of a series query, 1 000 ``SeriesRow`` ``(name, labels, value, ts, window)``.

Times are the median of --repeat runs, per sample (row), with the cyclic garbage collector on as in
a running service (decoding 10 000 samples allocates ~20 000 tuples, which triggers collections),
and decode again with it off ("dec, no gc"). Sizes: raw, gzip level 1 and level 6.
Prints figures and ratios, asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec
import orjson

from kcms.store import wire

LABEL_SETS = [
    (("code", "200"), ("method", "GET")),
    (("code", "500"), ("method", "POST")),
    (("code", "200"), ("method", "GET"), ("path", "/api/v1/orders")),
    (("code", "404"), ("method", "GET"), ("path", "/api/v1/items")),
    (("le", "0.25"), ("quantile", "0.99")),
]


def write_samples(n: int, seed: int = 1) -> list[wire.WireSample]:
    """``n`` samples: 10 metrics over 1 000 pods (10 namespaces), 2-3 label pairs each."""
    rng = random.Random(seed)
    t0 = time.time()
    metrics = [f"http_requests_{i}_total" if i % 3 == 0 else f"app_queue_depth_{i}" for i in range(10)]
    out: list[wire.WireSample] = []
    for i in range(n):
        pod = i % 1000
        out.append(
            (
                metrics[(i // 1000) % len(metrics)],
                "pods",
                f"team-{pod % 10}",
                f"checkout-7d9f8b6c5-{pod:05d}",
                LABEL_SETS[i % len(LABEL_SETS)],
                round(t0 + (i % 15) * 0.001, 3),
                rng.random() * 1000.0,
            )
        )
    return out


def query_rows(n: int, seed: int = 2) -> list[wire.SeriesRow]:
    rng = random.Random(seed)
    t0 = time.time()
    return [
        (
            f"checkout-7d9f8b6c5-{i:05d}",
            LABEL_SETS[i % len(LABEL_SETS)],
            rng.random() * 100.0,
            t0 - rng.random() * 15.0,
            None if i % 2 else 60.0,
        )
        for i in range(n)
    ]


def _labels(pairs: list) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in pairs)


def orjson_samples_from(data: bytes) -> list[wire.WireSample]:
    return [(m, r, ns, n, _labels(lb), ts, v) for m, r, ns, n, lb, ts, v in orjson.loads(data)]


def orjson_rows_from(data: bytes) -> list[wire.SeriesRow]:
    return [(n, _labels(lb), v, ts, w) for n, lb, v, ts, w in orjson.loads(data)]


def median_time(fn: Callable[[], Any], repeat: int, collect: bool = True) -> float:
    """Median seconds of ``fn()``; ``collect=False``: with the cyclic garbage collector off."""
    fn()  # warm up (decoder caches, allocator)
    times = []
    gc.collect()
    if not collect:
        gc.disable()
    try:
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    finally:
        gc.enable()
    return statistics.median(times)


class Row:
    def __init__(self, codec: str, enc: float, dec: float, dec_nogc: float, data: bytes, n: int) -> None:
        self.codec = codec
        self.enc = enc / n * 1e9  # ns per item
        self.dec = dec / n * 1e9
        self.dec_nogc = dec_nogc / n * 1e9
        self.raw = len(data) / n
        self.gz1 = len(gzip.compress(data, 1)) / n
        self.gz6 = len(gzip.compress(data, 6)) / n

    @property
    def total(self) -> float:
        return self.enc + self.dec


def measure(
    codec: str, encode: Callable[[], bytes], decode: Callable[[bytes], Any], n: int, repeat: int, check: Any
) -> Row:
    data = encode()
    got = decode(data)
    if got != check:
        raise SystemExit(f"{codec}: decoded data differs from the original")
    enc = median_time(encode, repeat)
    dec = median_time(lambda: decode(data), repeat)
    dec_nogc = median_time(lambda: decode(data), repeat, collect=False)
    return Row(codec, enc, dec, dec_nogc, data, n)


def table(title: str, rows: list[Row], unit: str) -> None:
    print(f"\n{title}")
    print(
        f"  {'codec':<14} {'encode':>9} {'decode':>9} {'enc+dec':>9} {'dec, no gc':>10}   {'bytes/' + unit:>12} "
        f"{'gzip-1':>8} {'gzip-6':>8}"
    )
    for r in rows:
        print(
            f"  {r.codec:<14} {r.enc:>6.0f} ns {r.dec:>6.0f} ns {r.total:>6.0f} ns {r.dec_nogc:>7.0f} ns   {r.raw:>12.1f} "
            f"{r.gz1:>8.1f} {r.gz6:>8.1f}"
        )
    base = next(r for r in rows if r.codec == "orjson")
    mp = next(r for r in rows if r.codec == "msgpack")
    print(
        f"  msgpack vs orjson: encode {base.enc / mp.enc:.2f}x, decode {base.dec / mp.dec:.2f}x, "
        f"enc+dec {base.total / mp.total:.2f}x faster (decode without gc {base.dec_nogc / mp.dec_nogc:.2f}x); size {mp.raw / base.raw:.2f} of orjson raw, "
        f"{mp.gz1 / base.gz1:.2f} gzip-1, {mp.gz6 / base.gz6:.2f} gzip-6"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=10_000, help="samples in the write (default 10 000)")
    ap.add_argument("--rows", type=int, default=1000, help="rows in the query answer (default 1 000)")
    ap.add_argument("--repeat", type=int, default=30, help="timed runs per figure (median)")
    args = ap.parse_args()

    samples = write_samples(args.samples)
    body = wire.Write(samples=samples)
    json_enc = msgspec.json.Encoder()
    json_write = msgspec.json.Decoder(wire.Write)
    print(
        f"write: {args.samples:,} samples (metric, resource, namespace, name, 2-3 label pairs, ts, value); "
        f"query answer: {args.rows:,} SeriesRow; median of {args.repeat} runs, one core"
    )
    rows = [
        measure(
            "msgpack",
            lambda: wire.encode(body),
            lambda d: wire.decode(d, wire.Write),
            args.samples,
            args.repeat,
            body,
        ),
        measure(
            "msgpack-block",
            lambda: wire.encode(wire.Write(block=wire.block_of(samples))),
            lambda d: wire.decode(d, wire.Write),
            args.samples,
            args.repeat,
            wire.Write(block=wire.block_of(samples)),
        ),
        measure(
            "orjson",
            lambda: orjson.dumps(samples),
            orjson_samples_from,
            args.samples,
            args.repeat,
            samples,
        ),
        measure(
            "msgspec-json",
            lambda: json_enc.encode(body),
            json_write.decode,
            args.samples,
            args.repeat,
            body,
        ),
    ]
    table(f"write of {args.samples:,} samples (per sample)", rows, "sample")
    mp, block = rows[0], rows[1]
    print(
        f"  msgpack-block vs msgpack: decode {mp.dec / block.dec:.2f}x faster, encode {block.enc / mp.enc:.2f}x "
        f"slower (it builds the tables), size {block.raw / mp.raw:.2f}"
    )

    answer = query_rows(args.rows)
    json_rows = msgspec.json.Decoder(list[wire.SeriesRow])
    rows = [
        measure(
            "msgpack",
            lambda: wire.encode(answer),
            lambda d: wire.decode(d, list[wire.SeriesRow]),
            args.rows,
            args.repeat,
            answer,
        ),
        measure("orjson", lambda: orjson.dumps(answer), orjson_rows_from, args.rows, args.repeat, answer),
        measure(
            "msgspec-json", lambda: json_enc.encode(answer), json_rows.decode, args.rows, args.repeat, answer
        ),
    ]
    table(f"query answer of {args.rows:,} SeriesRow (per row)", rows, "row")


if __name__ == "__main__":
    main()
