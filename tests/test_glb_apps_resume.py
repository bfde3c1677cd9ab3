"""``python -m glb.apps`` tells the truth about a resume and about its order port
(issue 53, item 5): it says which snapshot it resumed from and how much was done,
its throughput counts this run's work alone, and it names the port it listens on,
not ``:0``; the UTS reference table has depth 14, the depth the checkpoint docs use."""

from __future__ import annotations

import json
import logging
import random
import re

import pytest
from test_glb_checkpoint import UTS12, kill_during, start, uts_run

from glb.apps import cli
from glb.apps.uts import published

pytestmark = pytest.mark.timeout(150)


def test_a_resumed_run_says_from_which_snapshot_and_counts_only_its_own_work(tmp_path):
    ck, record = tmp_path / "ck", tmp_path / "run.json"
    # one place: each snapshot holds all the nodes counted so far (place 0's result)
    first = start(uts_run(ck, 1, record), tmp_path / "first.out")
    assert kill_during(first, ck, random.Random(5), after=3), "the run ended before the kill"
    last = start(uts_run(ck, 2, record), tmp_path / "last.out")
    assert last.wait(120) == 0, (tmp_path / "last.out").read_text()[-3000:]
    printed, out = (tmp_path / "last.out").read_text(), json.loads(record.read_text())
    seq = out["checkpoints"]["resumed_from"]
    found = re.search(rf"resumed from snapshot {seq} \((\d+\.\d)% done\)", printed)
    assert found, f"no 'resumed from snapshot {seq} (X% done)' line in: {printed[-2000:]}"
    before = out.get("units_before_resume")
    assert out["result"] == UTS12 and 0 < before < UTS12, out
    assert float(found.group(1)) == round(100 * before / UTS12, 1)
    assert out["throughput"] == (UTS12 - before) / out["seconds"], (
        f"throughput {out['throughput']:,.0f} counts the {before:,} nodes done before the resume")


def test_a_malleable_run_names_the_port_it_listens_on(apgas_caplog, tmp_path, monkeypatch):
    """A scheduler hands a job APGAS_MALLEABLE_LISTEN=host:0 (any free port)."""
    monkeypatch.setenv("APGAS_MALLEABLE_LISTEN", "127.0.0.1:0")
    for name in ("APGAS_SCHEDULER", "APGAS_COMMUNICATOR", "APGAS_PLAIN_PROTOCOL", "APGAS_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    apgas_caplog.set_level(logging.INFO, logger="apgas.malleable")
    argv = ["pi", "--samples", "3000", "--chunk-size", "1000", "--places", "1", "--malleable"]
    assert cli.main(argv) == 0
    said = [r.getMessage() for r in apgas_caplog.records if r.name == "glb.apps"]
    listening = [r.getMessage() for r in apgas_caplog.records
                 if r.getMessage().startswith("listening for orders on ")]
    port = listening[0].rsplit(":", 1)[1]
    assert port != "0" and said == [f"malleable: orders to 127.0.0.1:{port} "
                                    "(APGAS_MALLEABLE_LISTEN chooses it)"], (said, listening)


def test_the_uts_reference_has_the_depth_the_checkpoint_docs_use():
    assert published({"depth": 14}) == 1_057_675_516  # geo fixed b0 4, seed 19
