"""Does the app's race tell the truth? The same shipped example raced several times through the
running app, quiet and under load, against an interleaved `python -m racer.bench` run of the
same prompt on the same machine.

    .venv/bin/python scripts/race_check.py                        # Summarise a passage, 128 tokens, 3 races per mode
    .venv/bin/python scripts/race_check.py --example "Copy with a small change" --races 5
    .venv/bin/python scripts/race_check.py --modes api,inspector  # skip the browser
    RACER_DTYPE=float32 .venv/bin/python scripts/race_check.py    # server and bench in float32

The bench is `racer.bench`'s loop (methods ar,tr,racer interleaved, `--bench-repeats` each, the
median) in a worker process that loads the model once, so it runs between any two races: the
host's speed drifts by 10-30 % over minutes, and every race is compared with the mean of the bench
just before it and the one just after it. Order (the machine must be otherwise idle; every step
runs alone except the load it adds):
  1. a bench; `python app.py` starts; the first race is sent at once, so it waits for the server's
     warm-up ("first after start-up"); a bench;
  2. per mode, `--races` races of the example, a bench after each:
       api        through gradio_client, nothing else running;
       inspector  the same while a second client steps through its own trace in the inspector
                  (it pauses while a bench runs);
       browser    from a Chromium page (the page renders every streamed update) while the second
                  client steps through the inspector; a fresh page each race, closed before the
                  bench (an idle Gradio page polls and renders: a bench beside one read up to
                  25 % slow).
Prints a table (per race: each lane's tokens/s, RACER's speed-ups, disturbed steps, its bench) and,
per mode, the median, the spread (max - min over the median), the median ratio of a race to
its bench, and the median of the races over the median of all benches; writes the same as JSON with --json. Needs Debian's Chromium and playwright for the
browser mode.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
LANES = ("racer", "ar", "tr")
# A copy-heavy example that runs long in both dtypes on the default model (bfloat16: 106 tokens,
# RACER's MAT 3.2; float32: 79 tokens, MAT 2.0). "Extract to JSON", the default before, now stops
# after 41 tokens in bfloat16: its first token is a one-step tie that the packed kernel breaks the
# other way, and a 41-token race of MAT 1.5 cannot tell a skewed clock from a right one.
DEFAULT_EXAMPLE = "Summarise a passage"


def settings(max_new: int, mode: str = "auto", capacity: int = 16) -> list[Any]:
    """The Settings view's values in racer_app.settings.FIELDS order (the app's defaults otherwise)."""
    return ["default", mode, capacity, 10_000, 10, 8, "paper", "merge", 0.0, 1.0, 0, max_new]


def parse_race(verdict: str, stats: dict[str, str]) -> dict[str, Any]:
    """RACER's speed-ups and each lane's tokens/s and disturbed steps, read from what the page shows
    (markdown through the API, rendered text in the browser)."""
    plain = verdict.replace("*", "")
    decode, _, whole = plain.partition("whole request")
    out: dict[str, Any] = {}
    m = re.search(r"RACER ([\d.]+)×", decode)
    out["speedup"] = float(m.group(1)) if m else None
    m = re.search(r"RACER ([\d.]+)×", whole)
    out["speedup_total"] = float(m.group(1)) if m else None
    m = re.search(r"(\d+) of \d+ forward passes", plain)
    out["disturbed"] = int(m.group(1)) if m else 0
    wall_tps = {}
    for lane, md in stats.items():
        md = md.replace("*", "")
        m = re.search(r"([\d.]+)\s*tok/s", md)
        out[f"{lane}_tps"] = float(m.group(1)) if m else None
        # What wall time would have said: the lane shows its wall seconds when they differ.
        n, dec = re.search(r"(\d+) tokens", md), re.search(r"([\d.]+) s decoding", md)
        wall = re.search(r"at wall time ([\d.]+) s", md)
        if n and (wall or dec):
            wall_tps[lane] = int(n.group(1)) / float((wall or dec).group(1))
        m = re.search(r"(\d+) of \d+ forwards disturbed", md)
        out[f"{lane}_disturbed"] = int(m.group(1)) if m else 0
    if wall_tps.get("ar"):
        out["speedup_wall"] = round(wall_tps.get("racer", 0.0) / wall_tps["ar"], 3)
    return out


# -- bench ---------------------------------------------------------------------------------------

class BenchWorker:
    """`racer.bench`'s interleaved loop in a process of its own that loads the model once, so a bench
    can run between any two races: the host's speed drifts by 10-30 % over minutes, and each race is
    compared with the benches just before and just after it. The process idles between benches,
    the app's server between races."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--bench-worker"], cwd=ROOT, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def run(self, prompt: str, system: str, max_new: int, repeats: int) -> dict[str, Any]:
        """RACER's speed-up over plain decoding, decoding only (the prefill left out, as the race's
        headline) and the whole request, with each method's tokens/s: median of `repeats`."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"prompt": prompt, "system": system, "max_new": max_new,
                                          "repeats": repeats}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the bench worker exited")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def bench_worker() -> int:
    """The worker's side: one JSON request per stdin line, one JSON answer per stdout line."""
    sys.path.insert(0, str(ROOT))
    from racer.bench import BenchSettings, Row, run_rows
    from racer.models import load_model
    # The dtype and device the app's server takes (RACER_DTYPE, RACER_DEVICE), so both run alike.
    # Its cost curve and cold rows come with the first bench (run_rows makes them, untimed).
    lm = load_model(device=os.environ.get("RACER_DEVICE", "auto"), dtype=os.environ.get("RACER_DTYPE", "auto"))
    quiet = open(os.devnull, "w")
    for line in sys.stdin:
        req = json.loads(line)
        st = BenchSettings(max_new_tokens=req["max_new"], capacity="auto", repeats=req["repeats"], warmup=1)
        run = run_rows(lm, [Row("race-check", "check", [req["prompt"]], req["system"])], ["ar", "tr", "racer"], st,
                       progress=False, log=quiet)
        print(json.dumps(bench_figures(run.results)), flush=True)
    return 0


def bench_figures(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each method's tokens/s (decoding, and whole request) and RACER's speed-ups, from a bench's
    result rows: per repeat its wall time less its own prefill, then the median."""
    res: dict[str, Any] = {}
    for r in results:
        m = r["method"]
        dec = statistics.median(w - (p or 0) / 1e3 for w, p in zip(r["repeats_wall_s"], r["repeats_prefill_ms"]))
        res[f"{m}_tps"] = round(r["new_tokens"] / dec, 2)
        res[f"{m}_total_tps"] = round(r["tokens_per_s"], 2)
        res[f"{m}_mat"] = r["mat"]
    res["speedup"] = round(res["racer_tps"] / res["ar_tps"], 3)
    res["speedup_total"] = round(res["racer_total_tps"] / res["ar_total_tps"], 3)
    return res


# -- the app ---------------------------------------------------------------------------------------

def start_app() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PORT=str(port), HOST="127.0.0.1", GRADIO_ANALYTICS_ENABLED="False")
    log = open(ROOT / "artifacts" / "race-check-server.log", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError("app.py exited; see artifacts/race-check-server.log")
        try:
            urllib.request.urlopen(url, timeout=2)
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("app.py did not start")


def wait_for_warm_up(timeout_s: float = 1800) -> None:
    """Until the server's log says its warm-up is done (a bench beside it would be disturbed)."""
    log = ROOT / "artifacts" / "race-check-server.log"
    deadline = time.monotonic() + timeout_s
    while "warm-up done" not in log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise RuntimeError("the server's warm-up did not end; see artifacts/race-check-server.log")
        time.sleep(0.5)


def api_race(url: str, prompt: str, system: str, max_new: int) -> dict[str, Any]:
    import gradio_client
    c = gradio_client.Client(url, verbose=False)
    out = c.predict(0, prompt, system, *settings(max_new), api_name="/race")
    status, verdict = out[0], out[8]
    if "Finished" not in str(status):
        raise RuntimeError(f"race did not finish: {status}")
    return parse_race(str(verdict), {m: str(out[1 + 2 * i]) for i, m in enumerate(LANES)})


class Inspector(threading.Thread):
    """A second visitor: one short race of its own, then stepping through it in the inspector
    (every step re-renders the tree, automaton and text pictures) until told to stop. It starts
    held: `resume()` lets it go on, `pause()` holds it again (after its request in flight) while a
    bench runs."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        import gradio_client
        self.c = gradio_client.Client(url, verbose=False)
        self.c.predict(0, "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown",
                       "", *settings(40, "fixed"), api_name="/race")
        header = self.c.predict(1366, api_name="/inspector")[0]
        self.n = int(re.search(r"(\d+) steps", header).group(1))
        self.halt = threading.Event()
        self._go = threading.Event()
        self._idle = threading.Event()
        self.renders = 0
        self.errors: list[str] = []

    def pause(self) -> None:
        self._go.clear()
        self._idle.wait(timeout=60)

    def resume(self) -> None:
        self._go.set()

    def stop(self) -> None:
        self.halt.set()
        self._go.set()
        self.join(timeout=60)

    def run(self) -> None:
        # A request the client reports cancelled or failed (seen once in the browser mode) must not
        # end the load: it is counted and the next step asked for.
        k = 1
        while not self.halt.is_set():
            if not self._go.is_set():
                self._idle.set()
                self._go.wait()
                continue
            self._idle.clear()
            try:
                self.c.predict(k, 1366, api_name="/inspector_step")
                self.renders += 1
            except Exception as e:  # noqa: BLE001 - counted, reported with the results
                self.errors.append(type(e).__name__)
                if len(self.errors) > 50:
                    raise
                time.sleep(0.2)
            k = k % self.n + 1
        self._idle.set()


def browser_race(url: str, title: str, max_new: int) -> dict[str, Any]:
    """One race from a fresh Chromium page on the app's Race view, read from what the page shows.
    The browser is closed again before the next bench: an open Gradio page keeps polling and
    rendering, which slowed a bench beside it by up to 25 %."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        pg = b.new_page(viewport={"width": 1366, "height": 900})
        pg.set_default_timeout(600_000)
        pg.goto(url)
        pg.locator("#model-status").get_by_text(re.compile("loaded in")).wait_for()
        pg.get_by_role("tab", name="Settings").click()
        box = pg.get_by_label("number input for Max new tokens")
        box.fill(str(max_new))
        box.press("Enter")
        pg.get_by_role("tab", name="Race").click()
        pg.get_by_text(title).first.click()
        pg.locator("#run").click()
        pg.locator("#race-status").get_by_text(re.compile("Finished")).wait_for()
        out = parse_race(pg.locator("#verdict").inner_text(), {m: pg.locator(f"#stats-{m}").inner_text() for m in LANES})
        b.close()
    return out


def mean_bench(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of several bench runs' figures, key by key."""
    return {k: round(statistics.mean(r[k] for r in runs), 3) for k in runs[0] if all(r.get(k) for r in runs)}


KEYS = ("speedup", "speedup_total", "speedup_wall", "racer_tps", "ar_tps", "tr_tps")


def summarise(rows: list[dict[str, Any]], benches: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure: the median over the races, its spread (max - min over the median), the
    median of each race's ratio to its own bench (the mean of the bench before and after it) and
    to the median of all `benches` (`_vs_all`: a bench itself moves 10-30 % in minutes on a
    shared host, and a loaded race is charged what quiet races measured, not what this minute's
    bench reads)."""
    s: dict[str, Any] = {"n": len(rows)}
    for key in KEYS:
        xs = [r[key] for r in rows if r.get(key)]
        if not xs:
            continue
        med = statistics.median(xs)
        s[key] = round(med, 3)
        ref = [b[key] for b in benches if b.get(key)]
        if ref:
            s[key + "_vs_all"] = round(med / statistics.median(ref), 3)
        s[key + "_spread"] = round((max(xs) - min(xs)) / med, 3)
        ref_key = "speedup" if key == "speedup_wall" else key   # wall time against the same bench figure
        ratios = [r[key] / r["bench"][ref_key] for r in rows if r.get(key) and r["bench"].get(ref_key)]
        if ratios:
            s[key + "_vs_bench"] = round(statistics.median(ratios), 3)
    s["disturbed"] = [r["disturbed"] for r in rows]
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", default=DEFAULT_EXAMPLE, help="a shipped example's title (assets/examples.json)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--races", type=int, default=3, help="races per mode")
    ap.add_argument("--modes", default="api,inspector,browser")
    ap.add_argument("--bench-repeats", type=int, default=2, help="repeats of each bench between two races")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--bench-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bench_worker:
        return bench_worker()
    ex = {e["title"]: e for e in json.loads((ROOT / "assets" / "examples.json").read_text())}[args.example]
    prompt, system = ex["prompt"], ex.get("system") or ""
    (ROOT / "artifacts").mkdir(exist_ok=True)
    cpu = sorted(set(re.findall(r"avx512_bf16|avx2", Path("/proc/cpuinfo").read_text())))
    result: dict[str, Any] = {"example": args.example, "max_new_tokens": args.max_new_tokens, "cpu": cpu,
                              "dtype": os.environ.get("RACER_DTYPE", "auto"),
                              "command": " ".join(sys.argv)}
    worker = BenchWorker()
    benches: list[dict[str, Any]] = []
    races: dict[str, list[dict[str, Any]]] = {}

    def bench() -> dict[str, Any]:
        benches.append(worker.run(prompt, system, args.max_new_tokens, args.bench_repeats))
        return benches[-1]

    def series(mode: str, n: int, race: Any, load: Inspector | None = None,
               before: dict[str, Any] | None = None) -> None:
        """`n` races, a bench before each and after the last; each race keeps the mean of its two.
        The second visitor, if any, pauses while a bench runs."""
        print(f"{mode}: {n} race(s), a bench around each …", file=sys.stderr)
        before = before or bench()
        for _ in range(n):
            if load is not None:
                load.resume()
            r = race()
            if load is not None:
                load.pause()
            after = bench()
            r["bench"] = mean_bench([before, after])
            races.setdefault(mode, []).append(r)
            before = after

    bench()   # the worker's first bench warms it; not counted
    benches.clear()
    first_before = bench()
    proc, url = start_app()
    modes = args.modes.split(",")
    api = lambda: api_race(url, prompt, system, args.max_new_tokens)  # noqa: E731

    def first_race() -> dict[str, Any]:
        r = api()
        wait_for_warm_up()   # what the warm-up leaves after this race ends before the bench runs
        return r
    try:
        # Sent at once, so it waits for the server's warm-up: the first race a visitor can run.
        series("first", 1, first_race, before=first_before)
        if "api" in modes:
            series("api", args.races, api)
        for mode in ("inspector", "browser"):
            if mode not in modes:
                continue
            insp = Inspector(url)
            insp.start()
            race = functools.partial(browser_race, url, args.example, args.max_new_tokens) if mode == "browser" else api
            try:
                series(mode, args.races, race, load=insp)
            finally:
                insp.stop()
            result[f"{mode}_inspector_renders"] = insp.renders
            result[f"{mode}_inspector_errors"] = insp.errors
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        worker.close()
    result["benches"] = benches
    result["races"] = races
    result["summary"] = {m: summarise(rs, benches) for m, rs in races.items()}
    print(f"\n{args.example}, {args.max_new_tokens} new tokens, cpu {'/'.join(cpu)}, "
          f"RACER_DTYPE={os.environ.get('RACER_DTYPE', 'auto')}")
    sp = [b["speedup"] for b in benches]
    print(f"{len(benches)} benches (interleaved, median of {args.bench_repeats} each): RACER {min(sp):.2f}-{max(sp):.2f}× "
          f"decoding; plain decoding {min(b['ar_tps'] for b in benches)}-{max(b['ar_tps'] for b in benches)} tok/s. "
          "Each race is compared with the mean of the bench just before it and the one just after it.")
    print("| mode | race | RACER × | bench × | whole × | at wall time × | racer tok/s | ar tok/s | tr tok/s | "
          "bench tok/s racer / ar / tr | disturbed racer/ar/tr |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, rs in races.items():
        for i, r in enumerate(rs, 1):
            b = r["bench"]
            print(f"| {mode} | {i} | {r['speedup']} | {b['speedup']:.2f} | {r['speedup_total']} | {r.get('speedup_wall')} | "
                  f"{r['racer_tps']} | {r['ar_tps']} | {r['tr_tps']} | "
                  f"{b['racer_tps']:.1f} / {b['ar_tps']:.1f} / {b['tr_tps']:.1f} | "
                  f"{r['racer_disturbed']}/{r['ar_disturbed']}/{r['tr_disturbed']} |")
    print("\n| mode | median RACER × | spread | vs bench | whole × vs bench | at wall time × vs bench | "
          "tok/s vs bench racer / ar / tr | tok/s spread racer / ar / tr | vs all benches × | "
          "tok/s vs all benches racer / ar / tr |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode, s in result["summary"].items():
        print(f"| {mode} | {s.get('speedup')} | {s.get('speedup_spread')} | {s.get('speedup_vs_bench')} | "
              f"{s.get('speedup_total_vs_bench')} | {s.get('speedup_wall_vs_bench')} | "
              + " / ".join(str(s.get(f"{m}_tps_vs_bench")) for m in LANES) + " | "
              + " / ".join(str(s.get(f"{m}_tps_spread")) for m in LANES) + f" | {s.get('speedup_vs_all')} | "
              + " / ".join(str(s.get(f"{m}_tps_vs_all")) for m in LANES) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
