"""Does the app's race tell the truth? The same shipped example raced several times through the
running app, quiet and under load, against an interleaved `python -m racer.bench` run of the
same prompt on the same machine.

    .venv/bin/python scripts/race_check.py                        # Extract to JSON, 128 tokens, 3 races per mode
    .venv/bin/python scripts/race_check.py --example "Copy with a small change" --races 5
    .venv/bin/python scripts/race_check.py --modes api,inspector  # skip the browser

Order (the machine must be otherwise idle; every step runs alone except the load it adds):
  1. bench: `racer.bench` on the example's prompt, methods ar,tr,racer interleaved, 3 repeats;
  2. `python app.py` starts; the first race is sent at once, so it waits for the server's warm-up
     ("first after start-up");
  3. per mode, `--races` races of the example, then the bench again (each mode is compared with
     the mean of the bench runs before and after it: the machine's speed drifts over minutes):
       api        through gradio_client, nothing else running;
       inspector  the same while a second client steps through its own trace in the inspector;
       browser    from a Chromium page (the page renders every streamed update) while the second
                  client steps through the inspector.
Prints a table (per race: each lane's tokens/s, RACER's speed-ups, disturbed steps) and, per
mode, the median, the spread (max - min over the median) and the ratio to the bench; writes the
same as JSON with --json. Needs Debian's Chromium and playwright for the browser mode.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
LANES = ("racer", "ar", "tr")


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


# -- bench -----------------------------------------------------------------------------------------

def bench(prompt: str, max_new: int, repeats: int) -> dict[str, Any]:
    """RACER's speed-up over plain decoding in an interleaved racer.bench run of `prompt`:
    decoding only (the prefill left out, as the race's headline) and the whole request."""
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "prompt.jsonl"
        data.write_text(json.dumps({"question_id": "race-check", "category": "check", "turns": [prompt]}) + "\n")
        out = Path(d) / "out"
        subprocess.run([sys.executable, "-m", "racer.bench", "--data", str(data), "--methods", "ar,tr,racer",
                        "--max-new-tokens", str(max_new), "--capacity", "auto", "--repeats", str(repeats),
                        "--warmup", "1", "--out", str(out), "--no-progress"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        rows = {r["method"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    res: dict[str, Any] = {}
    for m, r in rows.items():
        # Decoding time per repeat (its wall time less its own prefill), then the median.
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
    (every step re-renders the tree, automaton and text pictures) until told to stop."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        import gradio_client
        self.c = gradio_client.Client(url, verbose=False)
        self.c.predict(0, "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown",
                       "", *settings(40, "fixed"), api_name="/race")
        header = self.c.predict(1366, api_name="/inspector")[0]
        self.n = int(re.search(r"(\d+) steps", header).group(1))
        self.halt = threading.Event()
        self.renders = 0
        self.errors: list[str] = []

    def run(self) -> None:
        # A request the client reports cancelled or failed (seen once in the browser mode) must not
        # end the load: it is counted and the next step asked for.
        k = 1
        while not self.halt.is_set():
            try:
                self.c.predict(k, 1366, api_name="/inspector_step")
                self.renders += 1
            except Exception as e:  # noqa: BLE001 - counted, reported with the results
                self.errors.append(type(e).__name__)
                if len(self.errors) > 50:
                    raise
                time.sleep(0.2)
            k = k % self.n + 1


def browser_races(url: str, title: str, max_new: int, n: int) -> list[dict[str, Any]]:
    from playwright.sync_api import sync_playwright
    out = []
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
        for _ in range(n):
            pg.locator("#run").click()
            # The last race's status reads "Finished … Racing on …" until this one's first frame.
            pg.wait_for_function("() => !document.querySelector('#race-status').innerText.includes('Finished')")
            pg.locator("#race-status").get_by_text(re.compile("Finished")).wait_for()
            out.append(parse_race(pg.locator("#verdict").inner_text(),
                                  {m: pg.locator(f"#stats-{m}").inner_text() for m in LANES}))
        b.close()
    return out


def mean_bench(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of several bench runs' figures, key by key."""
    return {k: round(statistics.mean(r[k] for r in runs), 3) for k in runs[0] if all(r.get(k) for r in runs)}


def summarise(rows: list[dict[str, Any]], ref: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {"n": len(rows)}
    for key in ("speedup", "speedup_total", "speedup_wall", "racer_tps", "ar_tps", "tr_tps"):
        xs = [r[key] for r in rows if r.get(key)]
        if not xs:
            continue
        med = statistics.median(xs)
        s[key] = round(med, 3)
        s[key + "_spread"] = round((max(xs) - min(xs)) / med, 3)
        ref_key = "speedup" if key == "speedup_wall" else key   # wall time against the same bench figure
        if ref.get(ref_key):
            s[key + "_vs_bench"] = round(med / ref[ref_key], 3)
    s["disturbed"] = [r["disturbed"] for r in rows]
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", default="Extract to JSON", help="a shipped example's title (assets/examples.json)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--races", type=int, default=3, help="races per mode")
    ap.add_argument("--modes", default="api,inspector,browser")
    ap.add_argument("--bench-repeats", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    ex = {e["title"]: e for e in json.loads((ROOT / "assets" / "examples.json").read_text())}[args.example]
    if ex.get("system"):
        raise SystemExit("pick an example without a system prompt: racer.bench has none")
    (ROOT / "artifacts").mkdir(exist_ok=True)
    cpu = sorted(set(re.findall(r"avx512_bf16|avx2", Path("/proc/cpuinfo").read_text())))
    result: dict[str, Any] = {"example": args.example, "max_new_tokens": args.max_new_tokens, "cpu": cpu,
                              "command": " ".join(sys.argv)}
    bench_labels = result["bench_labels"] = []

    def run_bench(label: str) -> dict[str, Any]:
        bench_labels.append(label)
        print(f"bench ({label}): {args.example}, {args.max_new_tokens} tokens, {args.bench_repeats} repeats …",
              file=sys.stderr)
        return bench(ex["prompt"], args.max_new_tokens, args.bench_repeats)

    # The machine's own speed drifts by 10-30 % over minutes on a shared host, so each mode is
    # compared with the mean of a bench run just before it and one just after it.
    benches = result["benches"] = [run_bench("before the app")]
    refs: dict[str, dict[str, Any]] = {}
    proc, url = start_app()
    races: dict[str, list[dict[str, Any]]] = {}
    modes = args.modes.split(",")
    try:
        print("first race after start-up …", file=sys.stderr)
        races["first"] = [api_race(url, ex["prompt"], "", args.max_new_tokens)]
        if "api" in modes:
            races["api"] = [api_race(url, ex["prompt"], "", args.max_new_tokens) for _ in range(args.races)]
        benches.append(run_bench("after the quiet races"))
        refs["first"] = refs["api"] = mean_bench(benches[-2:])
        for mode in ("inspector", "browser"):
            if mode not in modes:
                continue
            print(f"{mode} races …", file=sys.stderr)
            insp = Inspector(url)
            insp.start()
            try:
                if mode == "inspector":
                    races[mode] = [api_race(url, ex["prompt"], "", args.max_new_tokens) for _ in range(args.races)]
                else:
                    races[mode] = browser_races(url, args.example, args.max_new_tokens, args.races)
            finally:
                insp.halt.set()
                insp.join(timeout=60)
            result[f"{mode}_inspector_renders"] = insp.renders
            result[f"{mode}_inspector_errors"] = insp.errors
            benches.append(run_bench(f"after the {mode} races"))
            refs[mode] = mean_bench(benches[-2:])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ref = mean_bench(benches)
    result["races"] = races
    result["summary"] = {m: summarise(rs, refs[m]) for m, rs in races.items()}
    print(f"\n{args.example}, {args.max_new_tokens} new tokens, cpu {'/'.join(cpu)}")
    for label, b in zip(bench_labels, benches):
        print(f"bench {label} (interleaved, median of {args.bench_repeats}): RACER {b['speedup']:.2f}× decoding, "
              f"{b['speedup_total']:.2f}× whole request; tok/s racer {b['racer_tps']}, ar {b['ar_tps']}, "
              f"tr {b['tr_tps']}")
    print(f"all benches: RACER {ref['speedup']:.2f}× decoding; each mode below is compared with the mean of the "
          "bench before it and the one after it")
    print("| mode | race | RACER × | whole × | at wall time × | racer tok/s | ar tok/s | tr tok/s | disturbed racer/ar/tr |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, rs in races.items():
        for i, r in enumerate(rs, 1):
            print(f"| {mode} | {i} | {r['speedup']} | {r['speedup_total']} | {r.get('speedup_wall')} | {r['racer_tps']} | "
                  f"{r['ar_tps']} | {r['tr_tps']} | {r['racer_disturbed']}/{r['ar_disturbed']}/{r['tr_disturbed']} |")
    print("\n| mode | median RACER × | spread | vs bench | whole × vs bench | at wall time × vs bench | "
          "tok/s vs bench racer / ar / tr | tok/s spread racer / ar / tr |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, s in result["summary"].items():
        print(f"| {mode} | {s.get('speedup')} | {s.get('speedup_spread')} | {s.get('speedup_vs_bench')} | "
              f"{s.get('speedup_total_vs_bench')} | {s.get('speedup_wall_vs_bench')} | "
              + " / ".join(str(s.get(f"{m}_tps_vs_bench")) for m in LANES) + " | "
              + " / ".join(str(s.get(f"{m}_tps_spread")) for m in LANES) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
