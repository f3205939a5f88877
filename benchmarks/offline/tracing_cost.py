"""`nvllm bench overhead --compare-tracing ROUNDS`: what tracing costs the requests, measured on the overhead bench.

The same workload runs with tracing off, with --otlp-traces-endpoint pointing at a port nobody listens on (a dead
collector, over the protocol $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says: grpc by default), and with a live OTLP/HTTP
collector (a sink in a process of its own, as a real collector runs elsewhere, that takes every export and answers
200), in turn, ROUNDS rounds; each
round compares its modes with its own tracing-off run (a paired ratio: the machine's load drifts between rounds),
and the median of those ratios is the figure. Each run starts its own engine (the core child inherits
the protocol variable), so the modes share nothing but the machine.
"""

import argparse
import asyncio
import multiprocessing
import os
import socket
import statistics
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from benchmarks.offline.overhead import measure
from benchmarks.result_file import write_result

MODES = ("off", "dead_collector", "live_collector")


class _Sink(BaseHTTPRequestHandler):
    """A collector that takes every OTLP/HTTP export (counting them in `exports`) and answers an empty success."""
    exports = None  # a multiprocessing.Value shared with the bench

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.exports.get_lock():
            self.exports.value += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def _serve_sink(exports, port) -> None:
    _Sink.exports = exports
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    port.value = server.server_address[1]
    server.serve_forever()


def _start_sink():
    """(process, port, export count) of a sink collector in a process of its own."""
    ctx = multiprocessing.get_context("spawn")
    exports, port = ctx.Value("i", 0), ctx.Value("i", 0)
    proc = ctx.Process(target=_serve_sink, args=(exports, port), daemon=True)
    proc.start()
    while port.value == 0 and proc.is_alive():
        proc.join(0.05)
    return proc, port.value, exports


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _run(args, endpoint: str | None, protocol: str | None) -> float:
    run_args = argparse.Namespace(**vars(args))
    run_args.otlp_traces_endpoint = endpoint
    saved = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
    if protocol is not None:
        os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = protocol
    try:
        return (await measure(run_args))["requests_per_s"]
    finally:
        if saved is None:
            os.environ.pop("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", None)
        else:
            os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = saved


def run_compare_tracing(args) -> int:
    result = compare_tracing(args)
    print(f"tracing, requests per second against tracing off in the same round (median of {result['rounds']}): "
          + ", ".join(f"{m} {r:.3f}x" for m, r in result["median_ratio_to_off"].items()))
    if args.output_json:
        write_result(args, result)
    return 0


def compare_tracing(args) -> dict:
    sink, sink_port, exports = _start_sink()
    dead_protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or "grpc"
    endpoints = {"off": (None, None),
                 "dead_collector": (f"http://127.0.0.1:{_closed_port()}", dead_protocol),
                 "live_collector": (f"http://127.0.0.1:{sink_port}", "http/protobuf")}
    runs: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        for i in range(args.compare_tracing):
            order = MODES if i % 2 == 0 else MODES[::-1]  # alternate, so no mode always runs first
            for mode in order:
                rate = asyncio.run(_run(args, *endpoints[mode]))
                runs[mode].append(rate)
                print(f"round {i + 1}, tracing {mode}: {rate:.1f} req/s", flush=True)
    finally:
        sink.kill()
        sink.join()
    medians = {mode: statistics.median(rates) for mode, rates in runs.items()}
    ratios = {mode: [round(r / off, 3) for r, off in zip(runs[mode], runs["off"])] for mode in MODES[1:]}
    return {"requests": args.num_requests, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
            "rounds": args.compare_tracing, "dead_collector_protocol": dead_protocol,
            "live_collector_protocol": "http/protobuf", "live_collector_exports": exports.value,
            "requests_per_s": runs, "median_requests_per_s": medians,
            "ratio_to_off_by_round": ratios,
            "median_ratio_to_off": {mode: statistics.median(r) for mode, r in ratios.items()}}
