"""The scheduler's dashboard: its view model, its door (token, limits, bad
requests), ``report --html``, and the live page in a real headless browser
while real jobs grow and shrink."""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import eventually
from test_scheduler_live import PY, bench, job, wait_ended, wait_for

from apgas import auth
from apgas.serving._webview import render_page
from apgas_scheduler.live import access
from apgas_scheduler.live.dashboard import MAX_STREAMS
from apgas_scheduler.live.views import dashboard_model

ROOT = Path(__file__).resolve().parent.parent

EVENTS = [
    {"t": 0.0, "event": "pool", "nodes": ["n0", "n1", "n2"]},
    {"t": 0.0, "event": "submit", "job": 1, "name": "uts", "class": "malleable",
     "min_nodes": 1, "max_nodes": 3},
    {"t": 0.5, "event": "submit", "job": 2, "name": "<b>pi</b>", "class": "rigid",
     "min_nodes": 1, "max_nodes": 1},
    {"t": 1.0, "event": "decision", "job": 1, "decision": "start", "nodes": 1, "policy": "malleable"},
    {"t": 1.0, "event": "start", "job": 1, "nodes": ["n0"]},
    {"t": 2.0, "event": "reserve", "job": 1, "nodes": ["n1", "n2"]},
    {"t": 2.3, "event": "timing", "job": 1, "name": "growTimeAPGAS", "n": 2, "seconds": 0.25},
    {"t": 2.4, "event": "grow", "job": 1, "nodes": ["n1", "n2"], "duration": 0.4},
    {"t": 5.0, "event": "shrink", "job": 1, "nodes": ["n2"], "duration": 0.1},
    {"t": 5.0, "event": "start", "job": 2, "nodes": ["n2"]},
    {"t": 8.0, "event": "end", "job": 1, "state": "done", "reason": ""},
    {"t": 9.0, "event": "end", "job": 2, "state": "done", "reason": ""},
]


def section(model: dict, name: str) -> dict:
    return next(s for s in model["sections"] if s["id"] == name)


def test_the_model_of_a_run():
    model = dashboard_model(EVENTS)
    nodes = section(model, "nodes")
    assert nodes["rows"] == ["n0", "n1", "n2"]
    assert sorted(nodes["bars"]) == [[0, 1.0, 8.0, "1", "1"], [1, 2.0, 8.0, "1", "1"],
                                     [2, 2.0, 5.0, "1", "1"], [2, 5.0, 9.0, "2", "2"]]
    grow, shrink = nodes["marks"]
    assert (grow["kind"], grow["t"], grow["key"], grow["rows"]) == ("grow", 2.4, "1", [1, 2])
    assert "in 0.40 s" in grow["label"] and "growTimeAPGAS 0.250 s" in grow["label"]
    assert grow["short"] == "+2 0.25s"  # as the job reported it
    assert (shrink["kind"], shrink["rows"], shrink["short"]) == ("shrink", [2], "−1 0.10s")
    assert nodes["legend"] == {"1": "1: uts", "2": "2: <b>pi</b>"}
    jobs = section(model, "jobs")["rows"]
    assert [r[:9] for r in jobs] == [[2, "<b>pi</b>", "rigid", "done", 0, 1, 1, 0, 0],
                                     [1, "uts", "malleable", "done", 0, 1, 3, 1, 1]]
    assert section(model, "decisions")["rows"] == [[1.0, "start", 1, 1, "malleable"]]
    util = section(model, "utilization")["series"]
    assert util[0]["points"] == [[1.0, 1], [2.0, 3], [8.0, 1], [9.0, 0]]
    assert util[2]["points"] == [[0.0, 1], [0.5, 2], [1.0, 1], [5.0, 0]]
    metrics = dict(section(model, "metrics")["items"])
    assert metrics["grows"] == 1 and metrics["shrinks"] == 1 and metrics["jobs"] == 2
    live = dashboard_model(EVENTS[:6], now=4.0)
    assert [0, 1.0, 4.0, "1", "1"] in section(live, "nodes")["bars"]  # held until now
    assert live["t1"] == 4.0


def test_the_page_is_self_contained_and_keeps_names_as_text():
    page = render_page(dashboard_model(EVENTS))
    assert "<b>pi</b>" not in page and "\\u003cb\\u003epi" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "default-src 'none'" in page


def test_report_html_from_a_log_and_a_bad_log(tmp_path):
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "apgas_scheduler", "report", str(log), "--html",
                           str(out)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "makespan" in done.stdout and out.read_text().startswith("<!DOCTYPE html>")
    log.write_text(json.dumps(EVENTS[0]) + "\nnot json\n")
    bad = subprocess.run([sys.executable, "-m", "apgas_scheduler", "report", str(log), "--html",
                          str(out)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and f"{log}:2: not JSON" in bad.stderr


# -- the door ------------------------------------------------------------------------------
def get(address, path: str, cookie: str = "") -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection(*address, timeout=10)
    conn.request("GET", path, headers={"Cookie": cookie} if cookie else {})
    return conn.getresponse()


def test_off_by_default(make_scheduler):
    assert make_scheduler(nodes=1, policy="fcfs").dashboard is None


def test_the_token_cookie_and_the_limits(make_scheduler):
    sched = make_scheduler(nodes=2, policy="fcfs", dashboard=("127.0.0.1", 0))
    board = sched.dashboard
    address = board.address
    assert address[0] == "127.0.0.1"
    token = access.dashboard_token(sched._key)
    assert board.url == f"http://127.0.0.1:{address[1]}/?token={token}"
    for path in ("/", "/model.json", "/stream"):
        response = get(address, path)
        assert response.status == 401 and b"dashboard-url" in response.read()
    assert get(address, "/?token=" + "0" * 32).status == 403
    assert get(address, "/", cookie="apgas_dashboard=" + "0" * 32).status == 401
    response = get(address, f"/?token={token}")
    assert response.status == 303 and response.getheader("Location") == "/"
    cookie = response.getheader("Set-Cookie").split(";")[0]
    assert "HttpOnly" in response.getheader("Set-Cookie")
    page = get(address, "/", cookie)
    assert page.status == 200 and "default-src 'none'" in page.getheader("Content-Security-Policy")
    assert b'"stream":"/stream"' in page.read()
    model = json.loads(get(address, "/model.json", cookie).read())
    assert section(model, "nodes")["rows"] == ["node0", "node1"]
    assert get(address, "/nothing", cookie).status == 404
    # garbage and a silent client do not stop it
    with socket.create_connection(address) as raw:
        raw.sendall(b"\x00\xff garbage\r\n\r\n")
        raw.recv(100)
    silent = socket.create_connection(address)
    # every stream taken: the next page is told so, the others go on
    streams = []
    for _ in range(MAX_STREAMS):
        conn = http.client.HTTPConnection(*address, timeout=10)
        conn.request("GET", "/stream", headers={"Cookie": cookie})
        response = conn.getresponse()
        assert response.status == 200
        assert response.readline().startswith(b"data: {")
        streams.append(conn)
    refused = get(address, "/stream", cookie)
    assert refused.status == 503 and str(MAX_STREAMS).encode() in refused.read()
    for conn in streams:
        conn.close()
    silent.close()
    sched.submit(job("quick", [sys.executable, "-c", "pass"]))
    wait_for(sched, "a stream again", lambda jobs: get(address, "/model.json", cookie).status == 200)
    assert sched.dashboard.model()  # still serving


def test_cli_serve_prints_the_url_and_dashboard_url_agrees(tmp_path):
    key = tmp_path / "key"
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()
    proc = subprocess.Popen([sys.executable, "-m", "apgas_scheduler", "serve", "--nodes", "a",
                             "--port", "0", "--key-file", str(key), "--dashboard", str(number),
                             "--socket", str(tmp_path / "s.sock"), "--output-dir",
                             str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        proc.stdout.readline()
        printed = proc.stdout.readline().strip()
        asked = subprocess.run([sys.executable, "-m", "apgas_scheduler", "dashboard-url",
                                "--dashboard", str(number), "--key-file", str(key)],
                               capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert asked.returncode == 0, asked.stderr
        assert printed == f"dashboard at {asked.stdout.strip()}"
        assert asked.stdout.strip() == (f"http://127.0.0.1:{number}/?token="
                                        f"{access.dashboard_token(auth.read_secret(key))}")
    finally:
        proc.terminate()
        proc.wait(30)
    missing = subprocess.run([sys.executable, "-m", "apgas_scheduler", "dashboard-url",
                              "--dashboard", "1", "--key-file", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert missing.returncode == 2 and "cannot read the operator's key" in missing.stderr


# -- in a browser --------------------------------------------------------------------------
def eventually_shown(what: str, check, timeout: float = 10.0):
    return eventually(check, f"the page to show {what}", timeout)


def bars(browser, job_id: int) -> list:
    return browser.find_elements("css selector", f"#nodes rect.bar[data-key='{job_id}']")


def test_the_live_page_shows_every_job_and_each_grow_within_seconds(make_scheduler, tmp_path,
                                                                    browser):
    sched = make_scheduler(nodes=4, policy="malleable", dashboard=("127.0.0.1", 0))
    browser.get(sched.dashboard.url)
    eventually_shown("the nodes", lambda: browser.find_elements("css selector", "#nodes svg"))
    assert "token" not in browser.current_url  # traded for a cookie at once
    out = tmp_path / "results"
    # each malleable job runs until it is shrunk (not for a guessed time), so both still
    # hold their two nodes when the rigid job comes, however slowly the machine runs
    ids = [sched.submit(job(name, [PY, str(ROOT / "tests" / "reporting_job.py")], "malleable", 1, 2))
           for name in ("m1", "m2")]
    for i in ids:
        jobs = wait_for(sched, f"job {i} grown", lambda jobs, i=i: jobs[i]["grows"] >= 1, timeout=60)
        grown = time.monotonic()
        eventually_shown(f"the grow of job {i}", lambda i=i: browser.find_elements(
            "css selector", f"#nodes .mark.grow[data-key='{i}']"), timeout=5.0)
        assert time.monotonic() - grown < 5.0
        assert len(bars(browser, i)) >= len(jobs[i]["nodes"])
        def label(i: int = i) -> str:  # the job's own timing lines join the mark as they come
            return browser.execute_script(f"return document.querySelector(\"#nodes .mark.grow"
                                          f"[data-key='{i}'] title\").textContent")

        eventually_shown(f"job {i}'s timing lines", lambda: "growTimeAPGAS" in label(), timeout=5.0)
        assert label().startswith(f"job {i} grows by"), label()
    ids.append(sched.submit(job("pi", bench("pi", out / "3.json", "--samples", "20000000"),
                                "rigid", 2)))
    wait_for(sched, "a shrink for the rigid job",
             lambda jobs: any(jobs[i]["shrinks"] for i in ids[:2]), timeout=60)
    eventually_shown("a shrink", lambda: browser.find_elements("css selector",
                                                                 "#nodes .mark.shrink"), timeout=5.0)
    ended = wait_ended(sched, ids, timeout=100)
    assert all(ended[i]["state"] == "done" for i in ids), ended
    def table_states() -> dict[int, str]:  # read in one go: the page redraws at any time
        return {int(k): v for k, v in browser.execute_script(
            "return Array.from(document.querySelectorAll('#jobs tr')).slice(1)"
            ".map(r => [r.cells[0].textContent, r.cells[3].textContent])")}

    eventually_shown("every job, done", lambda: all(bars(browser, i) for i in ids)
              and table_states() == {i: "done" for i in ids}, timeout=8.0)
    assert int(browser.find_element("css selector", "body").get_attribute("data-updates")) >= 3
    assert not [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def test_the_report_file_draws_every_job(tmp_path, browser):
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    out = tmp_path / "report.html"
    subprocess.run([sys.executable, "-m", "apgas_scheduler", "report", str(log), "--html", str(out)],
                   check=True, capture_output=True, timeout=60, cwd=ROOT)
    browser.get(out.as_uri())
    eventually_shown("both jobs", lambda: bars(browser, 1) and bars(browser, 2))
    assert len(bars(browser, 1)) == 3 and len(bars(browser, 2)) == 1
    assert browser.find_elements("css selector", "#nodes .mark.grow[data-key='1']")
    legend = browser.find_element("css selector", ".legend span[data-key='2']").text
    assert legend == "2: <b>pi</b>"  # a name is text, never markup


def test_a_restarted_scheduler_shows_the_earlier_run_and_report_reads_its_database(
        make_scheduler, tmp_path):
    state = tmp_path / "state"
    first = make_scheduler(nodes=2, policy="fcfs", state_dir=state)
    done = first.submit(job("before", [sys.executable, "-c", "pass"]))
    wait_ended(first, [done])
    first.shutdown()
    for t in list(first._threads):
        t.join(10)
    again = make_scheduler(nodes=2, policy="fcfs", state_dir=state, dashboard=("127.0.0.1", 0))
    model = json.loads(again.dashboard.model())
    assert [row[:4] for row in section(model, "jobs")["rows"]] == [[done, "before", "rigid", "done"]]
    assert [b[3] for b in section(model, "nodes")["bars"]] == [str(done)]
    out = tmp_path / "report.html"
    made = subprocess.run([sys.executable, "-m", "apgas_scheduler", "report", str(state), "--html",
                           str(out)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert made.returncode == 0, made.stderr
    assert f'"{done}":"{done}: before"' in out.read_text()  # the legend of the Gantt chart
