"""The scheduler's attacks of the security audit of issue 52 (3, 4, 6, 7 and 11).

Each test plays one attack against the scheduler's pure state (the Slurm
planner, the engine, the parsers) or an in-process scheduler with fake
processes, and checks that it is refused or bounded, and what the system says.
"""

from __future__ import annotations

import types

import pytest

from apgas import auth
from apgas.protocol import ascii_int
from apgas_scheduler.live.server import Server
from apgas_scheduler.policies import get_policy
from apgas_scheduler.slurm import mailbox
from apgas_scheduler.slurm.commands import _seconds
from apgas_scheduler.slurm.view import Planner, parse_jobs

pytestmark = pytest.mark.timeout(60)

NODES = ["node1", "node2", "node3", "node4"]
ODD_DIGITS = ["²", "٣", "１", "⁴", "𝟗"]  # str.isdigit() is True for each; int() fails or reads a digit


def squeue_job(job_id: int, state: str, nodes: str = "", count: int = 1, *, name: str = "j",
               reason: str = "None", comment: str = "", tres_nodes: int | None = None,
               submit: int = 1000, user: int = 1000, **extra: object) -> dict:
    """One entry of ``squeue --json`` (Slurm 22.05's shape)."""
    low = count if tres_nodes is None else tres_nodes
    return {"job_id": job_id, "user_id": user, "name": name, "job_state": state,
            "partition": "debug", "nodes": nodes, "node_count": count, "max_nodes": 0,
            "time_limit": 60, "submit_time": submit, "start_time": 1010, "resize_time": 0,
            "state_reason": reason, "comment": comment, "admin_comment": "",
            "tres_req_str": f"cpu={low},mem=1M,node={low},billing={low}", **extra}


# -- attack 3: one job name stopped the Slurm controller --------------------------------------

def test_ascii_int_takes_ascii_digits_only():
    assert ascii_int("0") == 0 and ascii_int("27100") == 27100
    for text in [*ODD_DIGITS, "", " 7", "7 ", "+7", "-7", "1_0", "7\n", "0x1f", "1e3", "9" * 65]:
        assert ascii_int(text) is None, repr(text)
    assert ascii_int("12", max_digits=1) is None


def test_a_held_job_named_companion_of_a_superscript_stops_no_pass_of_the_slurm_planner():
    """``apgas-companion-²`` (a held job of any user): every pass used to fail with
    "invalid literal for int()"; now it is an ordinary job and the pass resizes."""
    for digit in ODD_DIGITS:
        jobs = parse_jobs({"jobs": [
            squeue_job(1, "RUNNING", "node[1-4]", 4, tres_nodes=1, comment="apgas ready 0"),
            squeue_job(2, "PENDING", count=2, reason="Resources", submit=1100),
            squeue_job(3, "PENDING", name=f"apgas-companion-{digit}", reason="JobHeldUser",
                       user=2000),
            squeue_job(4, "RUNNING", "node4", name=f"apgas-companion-{digit}", user=1000)]})
        planner = Planner(get_policy("thrifty", resize_interval=0))
        orders = planner.plan(1200.0, jobs, NODES)
        assert [(j.id, o.verb) for j, o in orders] == [(1, "shrink")], digit


def test_a_signature_time_of_odd_digits_is_an_auth_error_not_a_crash():
    for digit in ODD_DIGITS:
        line = f"{auth.TAG} 17{digit}0 {'a' * 16} {'b' * auth._MAC_HEX} {{\"op\": \"status\"}}"
        with pytest.raises(auth.AuthError, match="malformed signature"):
            auth.parse_signed(line)


def test_a_job_message_naming_an_odd_digit_job_id_matches_no_job():
    server = Server.__new__(Server)
    server.core = types.SimpleNamespace(jobs={2: types.SimpleNamespace(state="running", reports="")})
    for digit in ODD_DIGITS:
        assert server.find_job(f"127.0.0.1:{digit}") is None, digit
    assert server.find_job("127.0.0.1:2") is server.core.jobs[2]


def test_slurm_time_limits_read_ascii_digits_only():
    assert _seconds("1-02:03:04") == ((24 + 2) * 3600 + 3 * 60 + 4)
    assert _seconds("²-00:00:10") == 10  # the odd day count is no number: no crash


def test_order_texts_keep_their_ascii_grammar():
    assert mailbox.parse_order("apgas-order 1 shrink ²") is None
