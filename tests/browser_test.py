#!/usr/bin/env python3
"""The run pages in a real browser: headless Chromium (Debian's), driven by
Playwright (scripts/browser-requirements.txt).

    browser_test.py CASE SWARMKV ROOT MODEL CHROMIUM SCREENSHOTS

Cases:
  contract_review_page      `swarmkv run examples/pipelines/contract-review.yaml
                            --html`: the file opens with no console error and
                            no request but itself; every agent is in the graph,
                            the timeline and the answers.
  served_fifty_agents_live  `swarmkv serve --api-key`: the fifty-agent example
                            posted (4 tokens an agent), its page opened with
                            the key as Basic auth's password while it runs,
                            seen running, followed until the last agent's bar
                            and the run's end; every agent in it; / lists the
                            run; without the key, 401 asking for Basic auth.
                            Then a page on another site (evil.test, which
                            the browser resolves to 127.0.0.1: DNS rebinding)
                            cannot read the run (403) and its POST of a
                            pipeline as text/plain is refused (403).

Screenshots go to SCREENSHOTS (the closing notes show them).
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import yaml
from serve_process import served
from playwright.sync_api import sync_playwright

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


class Browser:
    """One headless Chromium page that records console errors, failed
    page errors and every request it makes."""

    def __init__(self, playwright, chromium, credentials=None, args=()):
        self.browser = playwright.chromium.launch(executable_path=chromium,
                                                  args=["--no-sandbox", *args])
        self.context = self.browser.new_context(viewport={"width": 1280, "height": 900},
                                                http_credentials=credentials)
        self.page = self.context.new_page()
        self.errors = []
        self.requests = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))

    def close(self):
        self.browser.close()


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


def check_every_agent(page, names, where):
    """Each agent has its node in the graph, its bar in the timeline and its
    article, named and ended ok."""
    for i, name in enumerate(names):
        node = page.locator(f"#node-{i}")
        expect(node.count() == 1, f"{where}: no node for agent {i} ({name})")
        expect(name in node.locator("title").text_content(), f"{where}: node {i} is not {name}")
        bar = page.locator(f"#bar-{i}")
        expect(bar.count() == 1, f"{where}: no bar for agent {i} ({name})")
        expect(bar.locator("rect.prompt").count() == 1, f"{where}: agent {name}'s bar is not drawn")
        article = page.locator(f"#agent-{i}")
        expect(article.count() == 1, f"{where}: no answer for agent {name}")
        status = article.locator(".status").text_content()
        expect(status == "ok", f"{where}: agent {name} says '{status}'")


@case
def contract_review_page(swarmkv, root, model, chromium, shots):
    pipeline = os.path.join(root, "examples", "pipelines", "contract-review.yaml")
    with open(pipeline) as f:
        names = [a["name"] for a in yaml.safe_load(f)["agents"]]
    with tempfile.TemporaryDirectory(prefix="swarmkv-browser-") as tmp:
        page_file = os.path.join(tmp, "contract-review.html")
        env = dict(os.environ, SWARMKV_CACHE=os.path.join(tmp, "cache"))
        p = subprocess.run([swarmkv, "run", pipeline, "--model", model, "--html", page_file],
                           capture_output=True, text=True, env=env, timeout=600)
        expect(p.returncode == 0, f"swarmkv run failed ({p.returncode}): {p.stderr}")
        with sync_playwright() as pw:
            b = Browser(pw, chromium)
            url = "file://" + page_file
            b.page.goto(url)
            expect(b.page.title() == f"contract-review — {len(names)} agents", b.page.title())
            check_every_agent(b.page, names, "contract-review")
            expect(b.page.locator("path.edge.fork").count() == 2, "two fork_from edges")
            expect(b.page.locator("path.edge.needs").count() == 1, "one needs edge")
            expect(b.page.locator("path.edge.depends").count() >= 1, "depends_on edges")
            b.page.screenshot(path=os.path.join(shots, "contract-review.png"), full_page=True)
            expect(not b.errors, f"console errors: {b.errors}")
            expect(b.requests == [url], f"the page fetched more than itself: {b.requests}")
            b.close()
    print(f"contract-review page: {len(names)} agents, no console error, nothing fetched")


def another_site_cannot_use_the_server(pw, chromium, key, port, run_id, log_path):
    """evil.test resolves to 127.0.0.1 in this browser, as a rebinding DNS
    server would make it: the page at http://evil.test:PORT/ is the
    server's, same-origin in the browser's eyes, but its requests say
    Host: evil.test. A page at http://evil.test/ POSTs a pipeline as
    text/plain (no preflight) to the server itself."""
    # Chromium's own guard for pages reaching this machine (Local Network
    # Access) off: the server must not rely on one the user may have granted.
    b = Browser(pw, chromium, credentials={"username": "viewer", "password": key},
                args=["--host-resolver-rules=MAP evil.test 127.0.0.1",
                      "--disable-features=LocalNetworkAccessChecks,"
                      "BlockInsecurePrivateNetworkRequests,PrivateNetworkAccessSendPreflights"])
    res = b.page.goto(f"http://evil.test:{port}/runs/{run_id}")
    expect(res.status == 403, f"a rebound name read the run: {res.status}")
    expect("forbidden_host" in b.page.content(), b.page.content()[:300])
    b.page.route("http://evil.test/", lambda route: route.fulfill(
        status=200, content_type="text/html", body="<!doctype html><title>evil</title>"))
    b.page.goto("http://evil.test/")
    outcome = b.page.evaluate("""async (url) => {
        await fetch(url + "/v1/pipelines", {method: "POST", mode: "no-cors",
            headers: {"Content-Type": "text/plain"},
            body: JSON.stringify({document: {text: "x"}, agents: [{name: "a", prompt: "b"}]})});
        try {
            return await (await fetch(url + "/v1/pipelines/" + %s)).text();
        } catch (e) {
            return "not read: " + e;
        }
    }""" % json.dumps(run_id), f"http://127.0.0.1:{port}")
    b.close()
    expect(outcome.startswith("not read"), f"the other site read the run: {outcome[:300]}")
    with open(log_path) as f:
        log = f.read()
    expect(re.search(r"http POST /v1/pipelines 403 ", log), f"the cross-site POST: {log[-2000:]}")
    expect(re.search(r"http GET /v1/pipelines/\{id\} 403 ", log), f"the cross-site read: {log[-2000:]}")
    expect(log.count("pipeline run ") == 1, "the cross-site POST ran a pipeline")


def fifty_agents_request(root, max_tokens):
    """The fifty-agent example as a request: its document as text, each
    agent's max_tokens lowered (the page, not the answers, is under test)."""
    pipeline = os.path.join(root, "examples", "pipelines", "fifty-agents.yaml")
    with open(pipeline) as f:
        spec = yaml.safe_load(f)
    with open(os.path.join(os.path.dirname(pipeline), spec["document"]["file"])) as f:
        spec["document"] = {"text": f.read()}
    spec["defaults"]["max_tokens"] = max_tokens
    for a in spec["agents"]:
        a.pop("max_tokens", None)
    return spec


@case
def served_fifty_agents_live(swarmkv, root, model, chromium, shots):
    key = "page-k3y"
    spec = fifty_agents_request(root, 4)
    names = [a["name"] for a in spec["agents"]]
    expect(len(names) == 50, f"{len(names)} agents in the example")
    args = ("--api-key", key, "--snapshot-cache", "off")
    with tempfile.TemporaryDirectory(prefix="swarmkv-browser-") as tmp, \
            served(swarmkv, model, tmp, args) as (_, port, log_path):
        base = f"http://127.0.0.1:{port}"
        posted = {}

        accepted = threading.Event()

        def post():
            """Streamed: the run's id is in the headers, sent at once."""
            req = urllib.request.Request(f"{base}/v1/pipelines", data=json.dumps(spec).encode(),
                                         headers={"Authorization": f"Bearer {key}",
                                                  "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=600) as res:
                    posted["id"] = res.headers.get("X-SwarmKV-Run-Id")
                    accepted.set()
                    events = res.read().decode()
                result = events[events.rindex("event: result\ndata: "):].split("\n")[1]
                posted["result"] = json.loads(result[len("data: "):])
            except Exception as e:  # reported below
                posted["error"] = repr(e)
            accepted.set()

        poster = threading.Thread(target=post)
        poster.start()
        expect(accepted.wait(120) and "id" in posted, f"the POST failed: {posted.get('error')}")
        run = f"{base}/runs/{posted['id']}"
        try:  # (a browser without credentials just gives up on the challenge)
            urllib.request.urlopen(run, timeout=60)
            raise AssertionError(f"{run} answered without the key")
        except urllib.error.HTTPError as e:
            expect(e.code == 401, f"without the key: {e.code}")
            expect(e.headers.get("WWW-Authenticate", "").startswith("Basic "),
                   f"the 401 asks for Basic auth: {e.headers.get('WWW-Authenticate')}")
        with sync_playwright() as pw:
            b = Browser(pw, chromium, credentials={"username": "viewer", "password": key})
            res = b.page.goto(run)
            expect(res.status == 200, f"{run}: {res.status} {b.page.content()[:300]}")
            first_state = b.page.locator("#state").text_content()
            expect(first_state.startswith(("queued", "running")),
                   f"the run had ended before the browser saw it: {first_state}")
            expect(b.page.locator('meta[http-equiv="refresh"]').count() == 1,
                   "a page of a running run reloads itself")
            # The page reloads itself; the locators follow it.
            b.page.locator("g.node.running").first.wait_for(timeout=300_000)
            b.page.screenshot(path=os.path.join(shots, "served-run-live.png"), full_page=False)
            b.page.locator(f"#bar-{len(names) - 1} rect.prompt").wait_for(timeout=300_000)
            b.page.locator("#state", has_text=re.compile(r"^done")).wait_for(timeout=300_000)
            expect(b.page.locator('meta[http-equiv="refresh"]').count() == 0,
                   "an ended run's page does not reload")
            check_every_agent(b.page, names, "served run")
            b.page.screenshot(path=os.path.join(shots, "served-run-done.png"), full_page=False)
            b.page.goto(f"{base}/")
            link = b.page.locator(f"#run-{posted['id']} a").first
            expect(link.text_content() == posted["id"], f"/ lists run {posted['id']}")
            link.click()
            expect(b.page.url == run, f"the list links to {b.page.url}")
            expect(not b.errors, f"console errors: {b.errors}")
            foreign = [u for u in b.requests if not u.startswith(base + "/")]
            expect(not foreign, f"requests away from the server: {foreign}")
            reloads = sum(1 for u in b.requests if u == run)
            b.close()
            another_site_cannot_use_the_server(pw, chromium, key, port, posted["id"], log_path)
        poster.join(600)
        expect("result" in posted, f"the POST failed: {posted.get('error')}")
        expect(re.fullmatch(r"[0-9a-f]{32}", posted["id"]), f"X-SwarmKV-Run-Id: {posted['id']}")
        expect(posted["result"]["ok"], "the run failed")
        expect(reloads >= 3, f"the page was loaded {reloads} times: it did not follow the run")
    print(f"served page: {len(names)} agents followed live over {reloads} loads; "
          f"first seen '{first_state}'")


def main():
    if len(sys.argv) != 7 or sys.argv[1] not in CASES:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(CASES)}}} SWARMKV ROOT MODEL CHROMIUM "
                 "SCREENSHOTS")
    name, swarmkv, root, model, chromium, shots = sys.argv[1:]
    os.makedirs(shots, exist_ok=True)
    CASES[name](swarmkv, root, model, chromium, shots)


if __name__ == "__main__":
    main()
