"""Load test: 16 concurrent gradio_client users against one RACER Studio server on loopback.

    .venv/bin/python scripts/load_test.py                 # tiny random model, 16 clients
    .venv/bin/python scripts/load_test.py --clients 8 --max-new 16 --timeout 120
    .venv/bin/python scripts/load_test.py --model real    # the embedded default model: see scripts/load_real.py

The server runs in a child process (so its memory is measured alone) on 127.0.0.1 with the
tiny model (no downloads) and CPU limits: one decode at a time, light handlers unlimited.
Each client: a solo run first (sequential, the reference), then under load a mix of races,
inspector steps and bad inputs. Checks, all asserted:
  * every valid race gives the same text (RACER and plain columns) as its solo run (greedy);
  * every invalid request gets its message;
  * no session sees another's trace or automaton: each prompt carries a unique marker word
    whose characters map to token ids no other client's prompt has; a client's inspector
    header, text and automaton picture hold only its own prompt's and output's tokens;
  * the server's RSS after the run is back near its baseline (--rss-slack MB).
Prints one JSON summary: requests, ok, invalid-with-message, throughput, queue waits,
inspector latencies, peak / baseline / after RSS. Bounded: --timeout seconds overall.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
V = 512                  # tiny model vocabulary: ASCII ids < 128, marker ids 256..
MARK_BASE = 0x100        # client i's marker characters: chr(0x100 + 8 i + k) -> ids 256 + 8 i + k


def marker(i: int) -> str:
    return "".join(chr(MARK_BASE + 8 * i + k) for k in range(4))


def prompt_of(i: int) -> str:
    m = marker(i)
    return f"client{i:02d}{m} abc abc hello {m} world abc {m} abc"


# -- server (child process) ------------------------------------------------------------------------

def serve(port: int, max_new: int) -> None:
    sys.path.insert(0, str(ROOT))
    import torch
    torch.set_num_threads(1)
    os.environ.setdefault("RACER_CACHE", str(Path("/tmp") / f"racer-load-{os.getpid()}"))
    from racer.tiny import TinyTokenizer, tiny_lm

    import app
    from racer_app.settings import Limits

    class TextTokenizer(TinyTokenizer):
        def __call__(self, text, add_special_tokens=True, split_special_tokens=True):
            return {"input_ids": [ord(c) % self.vocab for c in text]}

    lm = tiny_lm(vocab=V, max_context=2048)
    lm.tokenizer = TextTokenizer(V)
    limits = Limits(max_new_tokens=max(64, max_new), max_prompt_tokens=300, time_limit_s=60, inspector_steps=16,
                    bench_max_prompts=2, chat_turns=3, decode_concurrency=1, on_gpu=False)
    demo = app.build_app(lm, limits=limits)
    demo.launch(server_name="127.0.0.1", server_port=port, quiet=True, prevent_thread_lock=True,
                **app.launch_kwargs())
    print("READY", flush=True)
    while True:
        time.sleep(3600)


# -- client side ---------------------------------------------------------------------------------------

def settings(max_new: int, **over):
    s = {"model": "default", "mode": "fixed", "capacity": 16, "acap": 10_000, "window": 10, "topk": 8,
         "rule": "paper", "merge": "merge", "temperature": 0.0, "top_p": 1.0, "seed": 0, "max_new": max_new}
    s.update(over)
    return list(s.values())


def text_of(highlighted) -> str:
    return "".join(d["token"] for d in highlighted or [])


def ids_in(s: str) -> set[int]:
    return {int(x) for x in re.findall(r"(?<![A-Za-z0-9_])t(\d+)(?![0-9])", s)}


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = self.ok = self.invalid_ok = 0
        self.failures: list[str] = []
        self.queue_waits: list[float] = []
        self.race_latency: list[float] = []
        self.light_latency: list[float] = []
        self.max_rank = 0

    def fail(self, msg: str) -> None:
        with self.lock:
            self.failures.append(msg)


def timed_race(c, prompt: str, max_new: int, stats: Stats, **over):
    """Submit a race and poll the job's status for the time it spent queued."""
    from gradio_client.utils import Status
    t0 = time.perf_counter()
    job = c.submit(0, prompt, "", *settings(max_new, **over), api_name="/race")
    started = None
    rank = 0
    while not job.done():
        st = job.status()
        if st.rank is not None:
            rank = max(rank, int(st.rank))
        if started is None and st.code in (Status.PROCESSING, Status.ITERATING, Status.FINISHED):
            started = time.perf_counter()
        time.sleep(0.02)
    out = job.result(timeout=5)
    t1 = time.perf_counter()
    with stats.lock:
        stats.queue_waits.append((started or t1) - t0)
        stats.race_latency.append(t1 - t0)
        stats.max_rank = max(stats.max_rank, rank)
    return out


def run_client(i: int, url: str, max_new: int, solo: dict, stats: Stats, deadline: float) -> None:
    from gradio_client import Client
    c = Client(url, verbose=False)
    p = prompt_of(i)
    own = solo[i]["allowed_ids"]
    others = {256 + 8 * j + k for j in range(64) if j != i for k in range(4)} - own

    def req(fn, *a, **kw):
        with stats.lock:
            stats.requests += 1
        return fn(*a, **kw)

    def check_race(out, label):
        status, racer_text, ar_text = out[0], text_of(out[2]), text_of(out[4])
        if "Finished" not in status:
            return stats.fail(f"client {i} {label}: status {status[:120]!r}")
        if racer_text != solo[i]["racer"] or ar_text != solo[i]["ar"]:
            return stats.fail(f"client {i} {label}: text differs from its solo run")
        with stats.lock:
            stats.ok += 1

    def check_inspector():
        t0 = time.perf_counter()
        header, _slider, _sentence, _tree, _cost, auto, _rows, text = req(c.predict, 0, api_name="/inspector")
        with stats.lock:
            stats.light_latency.append(time.perf_counter() - t0)
        if f"client{i:02d}" not in header or any(f"client{j:02d}" in header for j in range(64) if j != i):
            return stats.fail(f"client {i}: inspector header is not its own: {header[:100]!r}")
        seen = ids_in(text_of(text)) | ids_in(json.dumps(auto))
        if seen & others or not seen <= own:
            return stats.fail(f"client {i}: inspector shows tokens of another session: {sorted(seen - own)[:10]}")
        t0 = time.perf_counter()
        step = req(c.predict, 2, 0, api_name="/inspector_step")
        with stats.lock:
            stats.light_latency.append(time.perf_counter() - t0)
        seen = ids_in(text_of(step[5])) | ids_in(json.dumps(step[3]))
        if seen & others or not seen <= own:
            return stats.fail(f"client {i}: inspector step shows another session's tokens")
        with stats.lock:
            stats.ok += 2

    bad = [  # (kwargs for the race, prompt, expected message) — one kind per client, in turn
        ({}, "   ", "Please type a prompt"),
        ({}, "q" * 1_000_000, "characters long"),
        ({"max_new": 10_000}, p, "greater than maximum"),
        ({"top_p": "x"}, p, "Expected"),
        ({"model": "../../etc/passwd"}, p, "not in the list of choices"),
        ({}, "z" * 400, "400 tokens long"),
    ]
    try:
        out = req(timed_race, c, p, max_new, stats)
        check_race(out, "race 1")
        check_inspector()
        over, bp, expect = bad[i % len(bad)]
        try:
            kw = dict(over)
            mn = kw.pop("max_new", max_new)
            out = req(timed_race, c, bp, mn, stats, **kw)
            msg = out[0]
        except Exception as e:  # noqa: BLE001 - Gradio refused the input with a message
            msg = str(e)
        if expect in msg:
            with stats.lock:
                stats.invalid_ok += 1
        else:
            stats.fail(f"client {i}: bad input {expect!r} got {msg[:120]!r}")
        if time.time() < deadline:
            out = req(timed_race, c, p, max_new, stats)
            check_race(out, "race 2")
            check_inspector()
    except Exception as e:  # noqa: BLE001
        stats.fail(f"client {i}: {e.__class__.__name__}: {e}")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))], 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["tiny", "real"], default="tiny",
                    help="tiny: the random tiny model; real: the embedded default model as app.py serves it")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-new", type=int, default=None, help="new tokens per request (tiny 24, real 32)")
    ap.add_argument("--timeout", type=float, default=170.0, help="tiny model: bound on the concurrent phase (seconds)")
    ap.add_argument("--rss-slack", type=float, default=None,
                    help="MB the server may stay above its baseline (tiny 64, real 160)")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    sys.path.insert(0, str(ROOT / "scripts"))
    import load_real
    load_real.add_args(ap)
    args = ap.parse_args()
    real = args.model == "real"
    args.max_new = args.max_new or (32 if real else 24)
    args.rss_slack = args.rss_slack if args.rss_slack is not None else (160.0 if real else 64.0)
    if args.serve:
        if real:
            load_real.serve(args.serve)
        else:
            serve(args.serve, args.max_new)
        return 0
    if real:
        return load_real.run(args)
    args.clients = max(1, min(args.clients, 48))

    import psutil
    from gradio_client import Client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--max-new", str(args.max_new)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=str(ROOT))
    try:
        line = proc.stdout.readline()
        if "READY" not in line:
            print(json.dumps({"error": "server did not start"}))
            return 2
        sp = psutil.Process(proc.pid)
        rss = lambda: sp.memory_info().rss / 2**20  # noqa: E731
        peak = [0.0]
        sampling = threading.Event()

        def sampler():
            while not sampling.is_set():
                peak[0] = max(peak[0], rss())
                time.sleep(0.1)
        threading.Thread(target=sampler, daemon=True).start()

        # Solo runs: the reference texts (and warm-up).
        solo = {}
        for i in range(args.clients):
            c = Client(url, verbose=False)
            out = c.predict(0, prompt_of(i), "", *settings(args.max_new), api_name="/race")
            assert "Finished" in out[0], out[0]
            r, a = text_of(out[2]), text_of(out[4])
            pids = {ord(ch) % V for ch in prompt_of(i)}
            solo[i] = {"racer": r, "ar": a, "allowed_ids": pids | ids_in(r) | ids_in(a)}
        time.sleep(1.0)
        baseline = rss()

        stats = Stats()
        deadline = time.time() + args.timeout * 0.6
        threads = [threading.Thread(target=run_client, args=(i, url, args.max_new, solo, stats, deadline), daemon=True)
                   for i in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        # The bound covers the concurrent phase: building the kernels in the fresh cache and the
        # solo runs before it take as long as the machine needs.
        phase_end = time.time() + args.timeout
        for t in threads:
            t.join(timeout=max(1.0, phase_end - time.time()))
        wall = time.perf_counter() - t0
        hung = sum(t.is_alive() for t in threads)
        time.sleep(2.0)
        after = rss()
        sampling.set()
        summary = {
            "clients": args.clients, "max_new_tokens": args.max_new, "requests": stats.requests, "ok": stats.ok,
            "invalid_with_message": stats.invalid_ok, "failures": stats.failures[:20], "hung_clients": hung,
            "wall_s": round(wall, 2), "throughput_req_per_s": round(stats.requests / wall, 2),
            "races": len(stats.race_latency),
            "race_tokens_per_s": round(len(stats.race_latency) * 3 * args.max_new / wall, 1),
            "queue_wait_s": {"p50": pct(stats.queue_waits, 0.5), "p95": pct(stats.queue_waits, 0.95),
                             "max": pct(stats.queue_waits, 1.0)},
            "max_queue_position_seen": stats.max_rank,
            "race_latency_s": {"p50": pct(stats.race_latency, 0.5), "p95": pct(stats.race_latency, 0.95)},
            "inspector_latency_s": {"p50": pct(stats.light_latency, 0.5), "p95": pct(stats.light_latency, 0.95),
                                    "max": pct(stats.light_latency, 1.0)},
            "rss_mb": {"baseline": round(baseline, 1), "peak": round(peak[0], 1), "after": round(after, 1)},
        }
        ok = (not stats.failures and not hung and stats.invalid_ok == args.clients
              and after <= baseline + args.rss_slack)
        summary["passed"] = ok
        print(json.dumps(summary, indent=1, ensure_ascii=False))
        return 0 if ok else 1
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
