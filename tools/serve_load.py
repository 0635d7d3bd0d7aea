#!/usr/bin/env python3
"""Load generator for `kiln serve` (or any server of OpenAI's streamed `/v1/completions`
that honours kiln's `return_token_ids`). Python standard library only.

Usage:

    kiln serve --model DIR|PRESET --host 127.0.0.1 --port 0   # prints its port once ready
    python3 tools/serve_load.py --url http://127.0.0.1:PORT --model ID \\
        --concurrency 1,8,32,64 --requests 256 --prompt-len 32:512 --max-tokens 128 \\
        --vocab 151936 --seed 0 [--json OUT] [--timeout 600]

ID is the id `GET /v1/models` lists (the preset name, or the model directory's last path
component); --vocab is the model's vocabulary size (prompt ids are drawn below it).

What it sends. --seed fixes N = --requests prompts, each a list of token ids drawn
uniformly below --vocab, of a length drawn uniformly from A..=B (--prompt-len A:B, or one
length A); every concurrency level sends the same N prompts, so levels compare. Each
request is `POST /v1/completions` with `{"model", "prompt": [ids], "max_tokens": M,
"temperature": 0, "stream": true, "stream_options": {"include_usage": true},
"return_token_ids": true}`. There is no way to make the server ignore the end of sequence,
so a request may end before M tokens: tokens are counted as they arrive, from the
`token_ids` of each chunk's choice, never assumed to be M.

How. For each level C (--concurrency, a comma-separated list, run in order) C client
processes take the N requests in turn (fewer when N < C), each request on its own
connection, reading the server-sent events incrementally with `http.client` as they arrive.
A level ends when its last request has finished; the next starts then.

What it reports, one table line per level (and with --json OUT one JSON object per line,
the same figures with these names, plus the run's parameters and the errors by kind):
  requests      requests sent (N) and, under `ok`, those that finished without error
  tokens        output tokens received by the requests that finished without error
  wall_s        seconds from the level's start to its last request's end
  tok/s         output_tokens_per_s = tokens / wall_s, the level's throughput
  TTFT          time to first token: from just before the request is sent (connecting
                included) to the arrival of the first chunk that carries a token
  ITL           inter-token latency: the gap between consecutive chunks that carry tokens;
                a chunk carrying k tokens counts k gaps of (its gap / k), so the figure is
                per token. Tokens in the first chunk with tokens have no gap (TTFT covers
                them); a request with one token contributes none
  E2E           end-to-end latency: from just before the request is sent to the end of its
                stream (`data: [DONE]`)
  P50, P95      percentiles in milliseconds over the level's requests that finished
                without error (ITL: over all their tokens' gaps), interpolated linearly
                between the closest ranks as numpy's default does; `-` where there are no
                samples (null in JSON)
  errors        requests that failed: a status other than 200 (a full queue's 503 counts;
                it is not retried), a connection error or timeout (--timeout, per socket
                operation), a stream that ends without `data: [DONE]`, a chunk that is not
                JSON or carries an `error`, a finish_reason other than `stop` or `length`, a
                choice with text but no `token_ids`, or a usage whose completion_tokens
                differs from the tokens counted. Counted per kind (printed under the table
                line, `error_kinds` in JSON), never dropped silently; a failed request's
                tokens and latencies are left out of the figures above.

Before and after each level the server's /metrics is read, when it is kiln's: the mean
time to first token and inter-token latency the server itself measured over the level
(its histograms' sum / count) are printed under the table line and go into JSON as
server_ttft_mean_ms and server_itl_mean_ms (null for another server).

Timestamps are time.perf_counter() in each client process (one interpreter per client, so
clients do not wait for each other's parsing; a machine with fewer cores than clients still
shares its cores among them, and the figures are the client's view, upper bounds of the
server's). Exit status: 0 when every request of every level succeeded, 1 when any
failed (after every level has run and been reported), 2 for bad arguments or an unreachable
server (`GET /health` is asked first).
"""
import argparse
import http.client
import json
import math
import multiprocessing
import random
import sys
import time
import urllib.parse


def percentile(values, p):
    """The p-th percentile (0..=100) of values, by linear interpolation between the closest
    ranks (numpy's default, `linear`); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


class SseReader:
    """Server-sent events from a binary file-like object (an http.client response), one
    event's data at a time, as the lines arrive. Lines end in \\n, \\r\\n or \\r; `data:`
    lines of one event join with \\n; comments (`:`) and other fields are skipped; an event
    is dispatched at its blank line (or at the end of the stream, if it has data). A line is
    seen once its \n arrives, so a stream ending its lines in a bare \r alone would be read
    whole before its events come (servers end them in \n)."""

    def __init__(self, stream):
        self.stream = stream
        self.pending = b""  # the end of the stream when it has no final newline

    def lines(self):
        while True:
            line = self.stream.readline()
            if not line:
                if self.pending:
                    yield self.pending
                    self.pending = b""
                return
            line = self.pending + line
            self.pending = b""
            # a lone \r ends a line too (readline only splits at \n)
            parts = line.replace(b"\r\n", b"\n").split(b"\r")
            for part in parts[:-1]:
                yield part
            last = parts[-1]
            if last.endswith(b"\n"):
                for piece in last[:-1].split(b"\n"):
                    yield piece
            else:
                self.pending = last

    def events(self):
        data = []
        for raw in self.lines():
            line = raw.rstrip(b"\n").decode("utf-8", errors="replace")
            if line == "":
                if data:
                    yield "\n".join(data)
                    data = []
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "data":
                data.append(value)
        if data:
            yield "\n".join(data)


class Result:
    __slots__ = ("error", "ttft", "gaps", "e2e", "tokens")

    def __init__(self):
        self.error = None  # a short kind for the error table; None when it succeeded
        self.ttft = None
        self.gaps = []
        self.e2e = None
        self.tokens = 0


def run_request(target, body, timeout):
    """One streamed completion; a Result (with error set when it failed)."""
    result = Result()
    scheme, host, port, path = target
    connection_class = (http.client.HTTPSConnection if scheme == "https"
                        else http.client.HTTPConnection)
    conn = connection_class(host, port, timeout=timeout)
    try:
        start = time.perf_counter()
        conn.request("POST", path, body=body,
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        response = conn.getresponse()
        if response.status != 200:
            response.read()
            result.error = f"http {response.status}"
            return result
        last = None
        done = False
        usage_tokens = None
        for data in SseReader(response).events():
            now = time.perf_counter()
            if data.strip() == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                result.error = "chunk not JSON"
                return result
            if not isinstance(chunk, dict):
                result.error = "chunk not an object"
                return result
            if chunk.get("error") is not None:
                result.error = "error event"
                return result
            usage = chunk.get("usage")
            if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                usage_tokens = usage["completion_tokens"]
            carried = 0
            for choice in chunk.get("choices") or []:
                ids = choice.get("token_ids")
                if ids is None:
                    if choice.get("text"):
                        result.error = "text without token_ids"
                        return result
                    ids = []
                carried += len(ids)
                reason = choice.get("finish_reason")
                if reason is not None and reason not in ("stop", "length"):
                    result.error = f"finish_reason {reason}"
                    return result
            if carried:
                if last is None:
                    result.ttft = now - start
                else:
                    result.gaps.extend([(now - last) / carried] * carried)
                last = now
                result.tokens += carried
        if not done:
            result.error = "stream ended without [DONE]"
            return result
        result.e2e = time.perf_counter() - start
        if usage_tokens is not None and usage_tokens != result.tokens:
            result.error = "usage differs from tokens counted"
        return result
    except (OSError, http.client.HTTPException) as e:  # socket.timeout is an OSError
        result.error = type(e).__name__
        return result
    finally:
        conn.close()


def _client(target, bodies, timeout, counter, out, barrier):
    """One client process: takes the next request index until none is left."""
    barrier.wait()
    while True:
        with counter.get_lock():
            i = counter.value
            counter.value += 1
        if i >= len(bodies):
            return
        try:
            result = run_request(target, bodies[i], timeout)
        except Exception as e:  # a bug here must still count the request
            result = Result()
            result.error = f"client {type(e).__name__}: {e}"
        out.put((i, result))


def run_level(target, bodies, concurrency, timeout):
    """The level's requests from min(C, N) client processes (one interpreter each, so the
    clients' own parsing does not queue behind one lock); (results, wall seconds)."""
    context = multiprocessing.get_context("fork")
    counter = context.Value("i", 0)
    out = context.Queue()
    clients_n = min(concurrency, len(bodies))
    barrier = context.Barrier(clients_n + 1)
    clients = [context.Process(target=_client, args=(target, bodies, timeout, counter, out, barrier),
                               daemon=True) for _ in range(clients_n)]
    for c in clients:
        c.start()
    barrier.wait()
    start = time.perf_counter()
    results = [None] * len(bodies)
    for _ in bodies:
        i, result = out.get()
        results[i] = result
    wall = time.perf_counter() - start
    for c in clients:
        c.join()
    return results, wall


# The server's own latency histograms (kiln's /metrics): short name -> metric name.
SERVER_HISTOGRAMS = {"ttft": "kiln_time_to_first_token_seconds",
                     "itl": "kiln_inter_token_latency_seconds"}


def server_latencies(target, timeout):
    """{short name: (sum, count)} of the server's latency histograms, or None when /metrics
    cannot be read or lacks them (another server)."""
    scheme, host, port, path = target
    connection_class = (http.client.HTTPSConnection if scheme == "https"
                        else http.client.HTTPConnection)
    conn = connection_class(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        text = response.read().decode("utf-8", "replace")
        if response.status != 200:
            return None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        try:
            values[name] = float(value)
        except ValueError:
            continue
    found = {}
    for short, metric in SERVER_HISTOGRAMS.items():
        if f"{metric}_sum" not in values or f"{metric}_count" not in values:
            return None
        found[short] = (values[f"{metric}_sum"], values[f"{metric}_count"])
    return found


def summarize(results, wall, concurrency):
    ok = [r for r in results if r.error is None]
    kinds = {}
    for r in results:
        if r.error is not None:
            kinds[r.error] = kinds.get(r.error, 0) + 1
    tokens = sum(r.tokens for r in ok)
    ms = lambda v: None if v is None else v * 1000.0
    ttft = [r.ttft for r in ok if r.ttft is not None]
    gaps = [g for r in ok for g in r.gaps]
    e2e = [r.e2e for r in ok]
    row = {"concurrency": concurrency, "requests": len(results), "ok": len(ok),
           "errors": len(results) - len(ok), "error_kinds": kinds, "tokens": tokens,
           "wall_s": wall, "output_tokens_per_s": tokens / wall if wall > 0 else None}
    for name, values in (("ttft", ttft), ("itl", gaps), ("e2e", e2e)):
        for p in (50, 95):
            row[f"{name}_p{p}_ms"] = ms(percentile(values, p))
    return row


HEADER = (f"{'conc':>5} {'requests':>8} {'ok':>6} {'tokens':>8} {'wall_s':>8} {'tok/s':>9} "
          f"{'TTFT P50':>9} {'P95':>8} {'ITL P50':>8} {'P95':>8} {'E2E P50':>9} {'P95':>8} "
          f"{'errors':>6}")


def table_line(row):
    def f(v, width, digits=1):
        return f"{'-':>{width}}" if v is None else f"{v:>{width}.{digits}f}"
    return (f"{row['concurrency']:>5} {row['requests']:>8} {row['ok']:>6} {row['tokens']:>8} "
            f"{f(row['wall_s'], 8, 2)} {f(row['output_tokens_per_s'], 9)} "
            f"{f(row['ttft_p50_ms'], 9)} {f(row['ttft_p95_ms'], 8)} "
            f"{f(row['itl_p50_ms'], 8, 2)} {f(row['itl_p95_ms'], 8, 2)} "
            f"{f(row['e2e_p50_ms'], 9)} {f(row['e2e_p95_ms'], 8)} {row['errors']:>6}")


def parse_target(url):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--url {url!r}: want http://HOST:PORT")
    base = parts.path.rstrip("/")
    if base.endswith("/v1"):  # a base URL as the openai client takes it is fine too
        base = base[:-3]
    return parts.scheme, parts.hostname, parts.port, base


def positive_list(text):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want comma-separated integers")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every level must be at least 1")
    return values


def length_range(text):
    a, sep, b = text.partition(":")
    try:
        lo, hi = int(a), int(b if sep else a)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want A:B (or A), integers")
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"{text!r}: want 1 <= A <= B")
    return lo, hi


def positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: want at least 1")
    return value


def main():
    parser = argparse.ArgumentParser(
        description="Streamed /v1/completions load on kiln serve, level by level of "
                    "concurrency: throughput, TTFT, ITL and E2E percentiles, errors. "
                    "See the module docstring for what each figure means.")
    parser.add_argument("--url", required=True, help="the server, http://HOST:PORT")
    parser.add_argument("--model", required=True, help="the model id GET /v1/models lists")
    parser.add_argument("--concurrency", type=positive_list, default=[1, 8, 32, 64],
                        metavar="C,C,...",
                        help="levels of concurrent requests, comma-separated (default 1,8,32,64)")
    parser.add_argument("--requests", type=positive, required=True, metavar="N",
                        help="requests per level (N)")
    parser.add_argument("--prompt-len", type=length_range, required=True, metavar="A:B",
                        help="prompt lengths in tokens, uniform in A..=B")
    parser.add_argument("--max-tokens", type=positive, required=True, metavar="M",
                        help="max_tokens of every request")
    parser.add_argument("--vocab", type=positive, required=True, metavar="V",
                        help="the model's vocabulary size; prompt ids are below it")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts (default 0)")
    parser.add_argument("--json", metavar="OUT",
                        help="also write one JSON object per level to OUT (JSON lines)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="socket timeout per request operation (default 600)")
    args = parser.parse_args()
    try:
        target = parse_target(args.url)
    except ValueError as e:
        parser.error(str(e))

    scheme, host, port, base = target
    try:
        conn = (http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection)(
            host, port, timeout=min(args.timeout, 30.0))
        conn.request("GET", base + "/health")
        health = conn.getresponse()
        health.read()
        conn.close()
        if health.status != 200:
            print(f"{args.url}/health answered {health.status}; is the server ready?",
                  file=sys.stderr)
            sys.exit(2)
    except (OSError, http.client.HTTPException) as e:
        print(f"{args.url}/health: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)

    rng = random.Random(args.seed)
    lo, hi = args.prompt_len
    bodies = []
    for _ in range(args.requests):
        prompt = [rng.randrange(args.vocab) for _ in range(rng.randint(lo, hi))]
        bodies.append(json.dumps({
            "model": args.model, "prompt": prompt, "max_tokens": args.max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}).encode())
    request_target = (scheme, host, port, base + "/v1/completions")
    params = {"url": args.url, "model": args.model, "prompt_len": [lo, hi],
              "max_tokens": args.max_tokens, "vocab": args.vocab, "seed": args.seed}

    out = open(args.json, "w") if args.json else None
    print(f"{args.model} at {args.url}: {args.requests} requests per level, prompts of "
          f"{lo}..={hi} tokens (seed {args.seed}), max_tokens {args.max_tokens}; "
          f"latencies in ms", flush=True)
    print(HEADER, flush=True)
    failed = 0
    try:
        for concurrency in args.concurrency:
            before = server_latencies((scheme, host, port, base + "/metrics"), args.timeout)
            results, wall = run_level(request_target, bodies, concurrency, args.timeout)
            after = server_latencies((scheme, host, port, base + "/metrics"), args.timeout)
            row = summarize(results, wall, concurrency)
            for name in SERVER_HISTOGRAMS:
                mean = None
                if before and after and after[name][1] > before[name][1]:
                    total, count = (a - b for a, b in zip(after[name], before[name]))
                    mean = total / count * 1000.0
                row[f"server_{name}_mean_ms"] = mean
            failed += row["errors"]
            print(table_line(row), flush=True)
            if row["server_ttft_mean_ms"] is not None:
                print(f"{'':>5} server's view (/metrics, this level): TTFT mean "
                      f"{row['server_ttft_mean_ms']:.1f} ms, ITL mean "
                      f"{row['server_itl_mean_ms']:.2f} ms", flush=True)
            for kind, count in sorted(row["error_kinds"].items()):
                print(f"{'':>5} error: {count} x {kind}", flush=True)
            if out:
                out.write(json.dumps({**params, **row}) + "\n")
                out.flush()
    finally:
        if out:
            out.close()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
