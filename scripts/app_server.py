"""`python app.py` on a free local port for the screenshot scripts: started, waited for, stopped.

    with app_server() as url:
        ...                      # drive `url` with a browser
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def app_server(url: str | None = None, start_s: float = 180.0) -> Iterator[str]:
    """The address of a running app: `url` as given, else a fresh `python app.py` (stopped on exit)."""
    if url:
        yield url
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PORT=str(port), HOST="127.0.0.1", GRADIO_ANALYTICS_ENABLED="False")
    server = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        t0 = time.time()
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.time() - t0 > start_s:
                    raise RuntimeError("app.py did not start") from None
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
