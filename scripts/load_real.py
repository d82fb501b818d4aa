"""The real-model mode of scripts/load_test.py (`--model real`): RACER Studio as `python app.py`
serves it (the embedded default model, CPU limits from the environment) in a child process,
driven over loopback.

    .venv/bin/python scripts/load_test.py --model real            # 16 clients, 200 sessions

Phases, each measured and checked (a failed check is listed under "failures"):
  1. baseline: the model loaded, warmed up (one race), no session left;
  2. solo runs: each client's race, chat turn and the one-prompt benchmark alone (references);
  3. load: 16 clients at once, each: race -> inspector + step -> a bad input -> chat turn ->
     inspector, and every fourth a one-prompt benchmark; every output equals its solo run, and
     no client ever sees another client's marker word (each prompt carries its own);
  4. flood: one client keeps asking for races while its first runs (each refused), another
     client's race waits for at most that one decode;
  5. tab closed mid-race: a real browser tab (Chromium through Playwright; a raw event stream
     where there is none) starts a long race and closes; how long until the next one starts;
  6. sessions: 200 more sessions (a short race or chat turn each), then 180 close their tab and
     20 stay idle until their state expires; server RSS and temp-folder size before, at the peak
     and after, and what Gradio and RACER Studio still hold per session.
Prints one JSON summary; exit status 0 when every check passed.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
T0 = time.perf_counter()


def log(msg: str) -> None:
    """Progress on stderr (the summary alone goes to stdout)."""
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", file=sys.stderr, flush=True)

# -- server (child process) --------------------------------------------------------------------------


def _stats(demo: Any) -> dict[str, Any]:
    """What the server holds now (for the parent): sessions Gradio keeps, RACER sessions with
    data, their memory, the benchmark folders, the decode queue."""
    from racer_app import fairqueue
    from racer_app.session import Session
    desk = demo.racer_studio.desk
    holder = demo.state_holder
    sessions = list(holder.session_data.values())
    values = [st.state_data.get(desk.state._id) for st in sessions]
    live = [v for v in values if isinstance(v, Session) and not v.closed]
    sizes = [v.size_bytes() for v in live]
    q = fairqueue.of(demo)
    return {"gradio_sessions": len(sessions), "racer_sessions": len(live),
            "with_data": sum(1 for v in live if v.trace is not None or v.chat_drafter is not None),
            "session_bytes_total": sum(sizes), "session_bytes_max": max(sizes, default=0),
            "ended": desk.ended, "workspace_bytes": desk.workspace.size(),
            "queue": list(q.load()) if q is not None else None}


def serve(port: int) -> None:
    sys.path.insert(0, str(ROOT))
    import app
    demo = app.build_app()                    # the default model, loaded and warmed up as on a Space
    studio = demo.racer_studio
    studio.store.wait()
    while studio.warming:
        time.sleep(0.2)
    demo.launch(server_name="127.0.0.1", server_port=port, quiet=True, prevent_thread_lock=True,
                **app.launch_kwargs())
    lm = studio.store.peek()
    print("READY " + json.dumps({"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype),
                                 "limits": studio.limits.__dict__, "workspace": str(studio.desk.workspace.root)}),
          flush=True)
    for line in sys.stdin:               # the parent asks for stats on stdin
        if line.strip() == "stats":
            print("STATS " + json.dumps(_stats(demo)), flush=True)


# -- client side --------------------------------------------------------------------------------------

MARKS = [f"QZ{i:02d}XV" for i in range(64)]


def race_prompt(i: int) -> str:
    return f"Repeat this line twice, word for word: agent {MARKS[i]} reports to base {MARKS[i]} at noon."


def chat_message(i: int) -> str:
    return f"Write the code word {MARKS[i]} three times, then say done."


def settings(max_new: int, **over: Any) -> list[Any]:
    s = {"model": "default", "mode": "auto", "capacity": 16, "acap": 10_000, "window": 10, "topk": 8,
         "rule": "paper", "merge": "merge", "temperature": 0.0, "top_p": 1.0, "seed": 0, "max_new": max_new}
    s.update(over)
    return list(s.values())


def text_of(highlighted: Any) -> str:
    return "".join(d["token"] for d in highlighted or [])


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))], 3)


def dist(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "p50": pct(xs, 0.5), "p95": pct(xs, 0.95), "max": pct(xs, 1.0)}


def tree_bytes(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
        except OSError:
            pass
    return total


class Server:
    """The child process: start, RSS, temp folder, stats."""

    def __init__(self, ttl_s: float, tmp: Path) -> None:
        import psutil
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self.tmp = tmp
        env = dict(os.environ, TMPDIR=str(tmp), GRADIO_ANALYTICS_ENABLED="False",
                   RACER_SESSION_TTL_S=str(ttl_s))
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "load_test.py"), "--model", "real",
                                      "--serve", str(self.port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, cwd=str(ROOT), env=env)
        self.info: dict[str, Any] = {}
        self._lock = threading.Lock()
        for line in self.proc.stdout:
            if line.startswith("READY "):
                self.info = json.loads(line[6:])
                break
        if not self.info:
            raise RuntimeError("the server did not start")
        self.ps = psutil.Process(self.proc.pid)
        self.peak = 0.0
        self._sampling = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def rss_mb(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def tmp_mb(self) -> float:
        return tree_bytes(self.tmp) / 2**20

    def _sample(self) -> None:
        while not self._sampling.is_set():
            try:
                self.peak = max(self.peak, self.rss_mb())
            except Exception:  # noqa: BLE001 - the process is gone
                return
            time.sleep(0.2)

    def reset_peak(self) -> None:
        self.peak = self.rss_mb()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self.proc.stdin.write("stats\n")
            self.proc.stdin.flush()
            for line in self.proc.stdout:
                if line.startswith("STATS "):
                    return json.loads(line[6:])
        return {}

    def close(self) -> None:
        self._sampling.set()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Record:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = {}
        self.queue_wait: dict[str, list[float]] = {}
        self.failures: list[str] = []
        self.checks: dict[str, int] = {}

    def add(self, what: dict[str, list[float]], key: str, v: float) -> None:
        with self.lock:
            what.setdefault(key, []).append(v)

    def ok(self, name: str) -> None:
        with self.lock:
            self.checks[name] = self.checks.get(name, 0) + 1

    def fail(self, msg: str) -> None:
        with self.lock:
            self.failures.append(msg)


def timed(c: Any, api: str, args: tuple, rec: Record, decode: bool) -> Any:
    """Call an endpoint; record its latency and, for a decode, the time it waited in the queue."""
    from gradio_client.utils import Status
    t0 = time.perf_counter()
    if not decode:
        out = c.predict(*args, api_name=api.split(" ")[0])
        rec.add(rec.latency, api, time.perf_counter() - t0)
        return out
    job = c.submit(*args, api_name=api.split(" ")[0])
    started = None
    while not job.done():
        if started is None and job.status().code in (Status.PROCESSING, Status.ITERATING):
            started = time.perf_counter()
        time.sleep(0.1)
    out = job.result(timeout=30)
    t1 = time.perf_counter()
    rec.add(rec.latency, api, t1 - t0)
    rec.add(rec.queue_wait, api, (started or t1) - t0)
    return out


def others_in(text: str, i: int, n: int) -> list[str]:
    return [MARKS[j] for j in range(n) if j != i and MARKS[j] in text]


def bench_rows(overall_md: str) -> list[tuple[str, str, str, str]]:
    """(method, turns, tokens, identical to ar) from the benchmark's overall table."""
    rows = []
    for line in overall_md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and cells[0].startswith("`"):
            rows.append((cells[0], cells[1], cells[2], cells[7]))
    return rows


# -- phases ---------------------------------------------------------------------------------------------

def solo_runs(url: str, n: int, max_new: int) -> dict[str, Any]:
    from gradio_client import Client
    ref: dict[str, Any] = {"race": {}, "chat": {}}
    for i in range(n):
        c = Client(url, verbose=False)
        out = c.predict(0, race_prompt(i), "", *settings(max_new), api_name="/race")
        assert "Finished" in out[0], out[0]
        ref["race"][i] = (text_of(out[2]), text_of(out[4]), text_of(out[6]))
        hist = c.predict(chat_message(i), "", *settings(max_new), api_name="/chat")[0]
        ref["chat"][i] = hist[-1]["content"]
        c.close()
    c = Client(url, verbose=False)
    out = c.predict(0, "code", 1, max_new, ["ar", "racer"], False, *settings(max_new), api_name="/benchmark")
    assert "Done" in out[0], out[0]
    ref["bench"] = bench_rows(out[1])
    c.close()
    return ref


def load_phase(url: str, n: int, max_new: int, ref: dict[str, Any], rec: Record) -> list[Any]:
    from gradio_client import Client
    clients: list[Any] = []

    def client(i: int) -> None:
        c = Client(url, verbose=False)
        clients.append(c)
        try:
            out = timed(c, "/race", (0, race_prompt(i), "", *settings(max_new)), rec, True)
            got = (text_of(out[2]), text_of(out[4]), text_of(out[6]))
            if "Finished" not in out[0]:
                rec.fail(f"client {i}: race status {out[0][:100]!r}")
            elif got != ref["race"][i]:
                rec.fail(f"client {i}: race texts differ from the solo run")
            else:
                rec.ok("race identical to solo")
            if MARKS[i] in got[0]:
                rec.ok("race output holds the client's own marker")
            insp = timed(c, "/inspector", (0,), rec, False)
            header = insp[0]
            step = timed(c, "/inspector_step", (2, 0), rec, False)
            seen = json.dumps([insp, step], ensure_ascii=False)
            if others_in(seen, i, n) or MARKS[i] not in header:
                rec.fail(f"client {i}: the inspector shows another session ({others_in(seen, i, n)})")
            else:
                rec.ok("inspector shows only its own session")
            try:            # a bad input, answered with its message, changes nothing
                bad = timed(c, "/race (bad input)", (0, "   ", "", *settings(max_new)), rec, True)
                (rec.ok if "Please type a prompt" in bad[0] else rec.fail)("bad input gets its message")
            except Exception as e:  # noqa: BLE001
                rec.fail(f"client {i}: bad input raised {e}")
            hist = timed(c, "/chat", (chat_message(i), "", *settings(max_new)), rec, True)[0]
            reply = hist[-1]["content"]
            if reply != ref["chat"][i]:
                rec.fail(f"client {i}: chat reply differs from the solo run")
            else:
                rec.ok("chat identical to solo")
            header = timed(c, "/inspector", (0,), rec, False)[0]
            if others_in(json.dumps([hist, header], ensure_ascii=False), i, n):
                rec.fail(f"client {i}: chat shows another session")
            if i % 4 == 0:
                out = timed(c, "/benchmark", (0, "code", 1, max_new, ["ar", "racer"], False, *settings(max_new)),
                            rec, True)
                if "Done" not in out[0] or bench_rows(out[1]) != ref["bench"]:
                    rec.fail(f"client {i}: benchmark {out[0][:80]!r} rows {bench_rows(out[1])} != {ref['bench']}")
                else:
                    rec.ok("benchmark identical to solo")
        except Exception as e:  # noqa: BLE001
            rec.fail(f"client {i}: {e.__class__.__name__}: {str(e)[:200]}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return clients


def flood_phase(url: str, max_new: int) -> dict[str, Any]:
    """The flooder's first race runs; its ten further requests are refused; another client's
    race, sent after the flood, starts as soon as that one decode ends."""
    from gradio_client import Client
    from gradio_client.exceptions import ValidationError
    from gradio_client.utils import Status
    flood, other = Client(url, verbose=False), Client(url, verbose=False)
    first = flood.submit(0, race_prompt(60), "", *settings(max_new * 2), api_name="/race")
    while first.status().code not in (Status.PROCESSING, Status.ITERATING):
        time.sleep(0.05)
    started = time.perf_counter()
    refused = accepted = 0
    for _ in range(10):
        try:
            flood.submit(0, race_prompt(60), "", *settings(8), api_name="/race").result(timeout=600)
            accepted += 1
        except ValidationError:
            refused += 1
    t_join = time.perf_counter()
    job = other.submit(0, race_prompt(61), "", *settings(8), api_name="/race")
    first_end = other_started = None
    while not job.done():
        now = time.perf_counter()
        if first_end is None and first.done():
            first_end = now
        if other_started is None and job.status().code in (Status.PROCESSING, Status.ITERATING):
            other_started = now
        time.sleep(0.05)
    end = time.perf_counter()
    first_end = first_end or end
    other_started = other_started or end
    flood.close()
    other.close()
    return {"flood_requests": 11, "flood_accepted": 1 + accepted, "flood_refused": refused,
            "flooders_decode_s": round(first_end - started, 2),
            "flooders_decode_left_at_join_s": round(first_end - t_join, 2),
            "other_client_wait_s": round(other_started - t_join, 2)}


def tab_close_phase(url: str) -> dict[str, Any]:
    """A tab starts a long race and closes mid-race; the time until a queued race starts."""
    from gradio_client import Client
    from gradio_client.utils import Status
    waiter = Client(url, verbose=False)
    how = "chromium"
    try:
        from playwright.sync_api import sync_playwright
        if not os.path.exists("/usr/bin/chromium"):
            raise ImportError("no chromium")
    except ImportError:
        how = "raw event stream"
    if how == "chromium":
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update"]
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium", args=flags, headless=True)
            pg = b.new_page()
            pg.set_default_timeout(240_000)
            pg.goto(url)
            pg.locator("#model-status").get_by_text(re.compile("loaded in")).wait_for()
            pg.locator("#prompt textarea").fill(race_prompt(62) + " Then count from one to fifty in words.")
            pg.locator("#run").click()
            pg.locator("#race-status").get_by_text(re.compile("Racing on")).wait_for()
            job = waiter.submit(0, race_prompt(63), "", *settings(8), api_name="/race")
            while job.status().code not in (Status.IN_QUEUE,) and not job.done():
                time.sleep(0.05)
            t0 = time.perf_counter()
            pg.close()
            result = _wait_start(job, t0)
            b.close()
    else:
        result = _raw_tab(url, waiter)
    waiter.close()
    result["tab"] = how
    return result


def _wait_start(job: Any, t0: float) -> dict[str, Any]:
    from gradio_client.utils import Status
    while job.status().code not in (Status.PROCESSING, Status.ITERATING) and not job.done():
        time.sleep(0.05)
    freed = time.perf_counter() - t0
    job.result(timeout=600)
    return {"slot_freed_after_close_s": round(freed, 2)}


def _raw_tab(url: str, waiter: Any) -> dict[str, Any]:
    import uuid

    import httpx
    cfg = httpx.get(url + "config", timeout=30).json()
    fn = next(d["id"] for d in cfg["dependencies"] if d.get("api_name") == "race")
    h = uuid.uuid4().hex
    body = {"data": [None, 0, race_prompt(62), ""] + settings(256), "fn_index": fn, "session_hash": h,
            "event_data": None, "trigger_id": None}
    httpx.post(url + "gradio_api/queue/join", json=body, timeout=30).raise_for_status()
    with httpx.stream("GET", url + f"gradio_api/queue/data?session_hash={h}", timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data:") and json.loads(line[5:]).get("msg") == "process_generating":
                break
        job = waiter.submit(0, race_prompt(63), "", *settings(8), api_name="/race")
        time.sleep(0.5)
        t0 = time.perf_counter()
    return _wait_start(job, t0)


class RawSession:
    """One visitor over plain HTTP, as the page talks to the server: a heartbeat connection held
    open (closing it is closing the tab) and events through the queue."""

    def __init__(self, url: str, fns: dict[str, int]) -> None:
        import uuid
        from urllib.parse import urlparse
        self.url, self.fns = url, fns
        self.h = uuid.uuid4().hex
        u = urlparse(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=30)
        self.sock.sendall(f"GET /gradio_api/heartbeat/{self.h} HTTP/1.1\r\nHost: {u.hostname}\r\n\r\n".encode())
        self.sock.recv(1024)                     # the first "ALIVE": the server knows the session

    def call(self, api: str, data: list[Any]) -> list[Any]:
        import httpx
        body = {"data": data, "fn_index": self.fns[api], "session_hash": self.h, "event_data": None,
                "trigger_id": None}
        r = httpx.post(self.url + "gradio_api/queue/join", json=body, timeout=60)
        r.raise_for_status()
        ev = r.json()["event_id"]
        with httpx.stream("GET", self.url + f"gradio_api/queue/data?session_hash={self.h}", timeout=600) as resp:
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                msg = json.loads(line[5:])
                if msg.get("event_id") == ev and msg.get("msg") == "process_completed":
                    if not msg.get("success"):
                        raise RuntimeError(str(msg.get("output"))[:200])
                    return msg["output"]["data"]
        raise RuntimeError("the event stream ended without a result")

    def close(self) -> None:
        self.sock.close()


def _fn_indices(url: str) -> dict[str, int]:
    import httpx
    cfg = httpx.get(url + "config", timeout=30).json()
    return {d["api_name"]: d["id"] for d in cfg["dependencies"] if d.get("api_name")}


def sessions_phase(url: str, server: Server, n: int, idle: int, max_new: int, ttl_s: float,
                   rec: Record) -> dict[str, Any]:
    fns = _fn_indices(url)
    sessions: list[RawSession | None] = [None] * n
    lock = threading.Lock()
    todo = list(range(n))

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)          # in order: the first `idle` are the oldest, so they expire first
            try:
                s = RawSession(url, fns)
                sessions[i] = s
                if i % 2:
                    out = s.call("chat", [None, chat_message(i % 60), ""] + settings(max_new))
                else:
                    out = s.call("race", [None, 0, race_prompt(i % 60), ""] + settings(max_new))
                if i % 10 == 0:
                    s.call("inspector", [None, 0])
                if not isinstance(out, list):
                    rec.fail(f"session {i}: {str(out)[:100]}")
            except Exception as e:  # noqa: BLE001
                rec.fail(f"session {i}: {e.__class__.__name__}: {str(e)[:160]}")

    t0 = time.perf_counter()
    ended0 = server.stats().get("ended", 0)
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    made_s = time.perf_counter() - t0
    open_stats = server.stats()
    peak = {"rss_mb": round(server.peak, 1), "tmp_mb": round(server.tmp_mb(), 2), "stats": open_stats}
    expired_while_making = open_stats.get("ended", 0) - ended0
    for s in sessions[idle:]:                 # these tabs close (their heartbeat drops)
        if s is not None:
            s.close()
    closed_at = time.perf_counter()

    def wait(cond: Any, timeout: float) -> dict[str, Any] | None:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            st = server.stats()
            if cond(st):
                return st
            time.sleep(0.5)
        return None
    # the closed tabs' sessions let go at once; the idle ones keep theirs until it expires
    left = wait(lambda st: st.get("with_data", 0) <= idle, 120)
    tidied_s = time.perf_counter() - closed_at
    after_close = {"rss_mb": round(server.rss_mb(), 1), "stats": left or server.stats()}
    if left is None:
        rec.fail("closed tabs' sessions still hold data two minutes later")
    done = wait(lambda st: st.get("with_data", 1) == 0, ttl_s + 120)
    expired_s = time.perf_counter() - closed_at
    if done is None:
        rec.fail("idle sessions still hold data after their time to live")
    time.sleep(3.0)                          # the trimmer runs a second after the last session ends
    for s in sessions[:idle]:
        if s is not None:
            s.close()
    return {"sessions": n, "made_in_s": round(made_s, 1), "left_open_idle": idle, "peak": peak,
            "expired_while_making": expired_while_making,
            "closed_tabs_tidied_after_s": round(tidied_s, 1), "after_close": after_close,
            "idle_expired_after_close_s": round(expired_s, 1), "after_stats": done or server.stats()}


def run(args: Any) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="racer-load-"))
    t_all = time.perf_counter()
    server = Server(args.session_ttl, tmp)
    rec = Record()
    try:
        from gradio_client import Client
        url = server.url
        log(f"server up ({server.info.get('model')}, {server.info.get('dtype')}); warm-up race")
        c = Client(url, verbose=False)                          # warm-up
        c.predict(0, race_prompt(0), "", *settings(args.max_new), api_name="/race")
        c.close()
        log("solo runs")
        solo_t = time.perf_counter()
        ref = solo_runs(url, args.clients, args.max_new)
        solo_s = time.perf_counter() - solo_t
        _wait_no_data(server, args.session_ttl + 90)
        baseline = {"rss_mb": round(server.rss_mb(), 1), "tmp_mb": round(server.tmp_mb(), 2),
                    "stats": server.stats()}
        server.reset_peak()
        log(f"baseline {baseline['rss_mb']} MB; load phase, {args.clients} clients")
        t0 = time.perf_counter()
        clients = load_phase(url, args.clients, args.max_new, ref, rec)
        load_s = time.perf_counter() - t0
        load_peak = {"rss_mb": round(server.peak, 1), "tmp_mb": round(server.tmp_mb(), 2), "stats": server.stats()}
        for cl in clients:
            cl.close()
        log("flood phase")
        flood = flood_phase(url, args.max_new)
        if flood["flood_refused"] != 10:
            rec.fail(f"the flood got {flood['flood_accepted']} requests in")
        if flood["other_client_wait_s"] > flood["flooders_decode_left_at_join_s"] + 2.0:
            rec.fail("another client waited for more than the flooder's one decode")
        log("tab closed mid-race")
        tab = tab_close_phase(url)
        server.reset_peak()
        log(f"sessions phase, {args.sessions} sessions")
        sess = sessions_phase(url, server, args.sessions, args.idle_sessions, 4, args.session_ttl, rec)
        after = {"rss_mb": round(server.rss_mb(), 1), "tmp_mb": round(server.tmp_mb(), 2)}
        bound = baseline["rss_mb"] + args.rss_slack
        if after["rss_mb"] > bound:
            rec.fail(f"RSS after the sessions ended {after['rss_mb']} MB > baseline + {args.rss_slack} MB")
        summary = {
            "mode": "real", "server": server.info, "clients": args.clients, "max_new_tokens": args.max_new,
            "cpu_flags": _cpu_flags(), "solo_s": round(solo_s, 1), "load_wall_s": round(load_s, 1),
            "latency_s": {k: dist(v) for k, v in sorted(rec.latency.items())},
            "queue_wait_s": {k: dist(v) for k, v in sorted(rec.queue_wait.items())},
            "checks_passed": rec.checks, "failures": rec.failures[:30],
            "baseline": baseline, "load_peak": load_peak, "flood": flood, "tab_close": tab, "sessions_phase": sess,
            "after": after, "rss_bound_mb": round(bound, 1), "wall_s": round(time.perf_counter() - t_all, 1),
        }
        summary["passed"] = not rec.failures
        print(json.dumps(summary, indent=1, ensure_ascii=False, default=str))
        return 0 if summary["passed"] else 1
    finally:
        server.close()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_no_data(server: Server, timeout: float) -> None:
    """Until no session holds data (closed clients' tabs are tidied when their heartbeat drops)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline and server.stats().get("with_data", 0):
        time.sleep(1.0)


def _cpu_flags() -> list[str]:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    return sorted({f for f in ("avx2", "avx512_bf16", "avx512f") if re.search(rf"\b{f}\b", flags)})


def add_args(ap: Any) -> None:
    ap.add_argument("--sessions", type=int, default=200, help="real model: sessions of the memory phase")
    ap.add_argument("--idle-sessions", type=int, default=20, help="real model: of those, left open until they expire")
    ap.add_argument("--session-ttl", type=float, default=600.0,
                    help="real model: RACER_SESSION_TTL_S for the server (longer than making the sessions "
                         "takes, short enough to see the idle ones expire)")

