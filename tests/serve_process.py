"""`swarmkv serve` as a child process for the Python tests (browser_test.py,
openai_client_test.py): started on a free loopback port, always stopped."""

import contextlib
import os
import re
import subprocess
import time


@contextlib.contextmanager
def served(swarmkv, model, tmp, args=()):
    """Yields (process, port, log path) once the server listens (120 s at
    most); terminates it (then kills it after 60 s) whatever happens."""
    log_path = os.path.join(tmp, "serve.log")
    with open(log_path, "w") as log:
        server = subprocess.Popen([swarmkv, "serve", "--model", model, "--port", "0", *args],
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            with open(log_path) as f:
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", f.read())
            if m:
                break
            if server.poll() is not None:
                raise AssertionError(f"swarmkv serve exited: {open(log_path).read()}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"swarmkv serve did not listen within 120 s: {open(log_path).read()}")
            time.sleep(0.2)
        yield server, int(m.group(1)), log_path
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
