"""``python -m apgas.order``, called in this process as ``main(argv)``: bad arguments
stop it naming them (exit 2), an unreachable job is exit 2, and against a job
listening for orders the reply is printed and an ``error`` reply is exit 1; an
order signed with the wrong key or not at all is refused by the job."""

from __future__ import annotations

import pytest
from orders import free_address, free_port

import apgas
from apgas import auth
from apgas.order import main, send_order

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch):
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    for var in ("APGAS_SCHEDULER", "APGAS_MALLEABLE_LISTEN", "APGAS_COMMUNICATOR",
                "APGAS_PLAIN_PROTOCOL", "APGAS_JOB_ID", "APGAS_JOB_SECRET"):
        monkeypatch.delenv(var, raising=False)


class Newest(apgas.MalleableHandler):
    def pre_shrink(self, n, chosen=None):
        return apgas.places()[-n:]


def usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_bad_arguments_are_named(capsys, tmp_path):
    """No order, an address without a port, a missing or empty key file: each is a
    usage error that names what is wrong."""
    assert "no order given: grow N HOST..., shrink N or status" in usage_error(
        ["--to", "127.0.0.1:1"], capsys)
    assert "--to must look like host:port, got 'nowhere'" in usage_error(
        ["--to", "nowhere", "status"], capsys)
    missing = tmp_path / "absent.key"
    assert f"cannot read the key file {missing}" in usage_error(
        ["--to", "127.0.0.1:1", "--key-file", str(missing), "status"], capsys)
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    assert f"the key file {empty} is empty" in usage_error(
        ["--to", "127.0.0.1:1", "--key-file", str(empty), "status"], capsys)


def test_unreachable_job_is_exit_2(capsys):
    """Nobody listening at the address: exit 2, and the message names the address."""
    host, port = free_address()
    assert main(["--to", f"{host}:{port}", "--timeout", "5", "status"]) == 2
    assert f"cannot reach the job at {host}:{port}" in capsys.readouterr().err


def test_orders_to_a_listening_job(capsys, monkeypatch, tmp_path):
    """The CLI signs with the key the job keeps for its port (found by itself or given);
    the reply is printed, exit 0, or exit 1 for an ``error`` reply. The job refuses an
    order that is unsigned or signed with another key."""
    port = free_port()
    monkeypatch.setenv("APGAS_MALLEABLE_LISTEN", f"127.0.0.1:{port}")
    to = f"127.0.0.1:{port}"
    wrong = tmp_path / "wrong.key"
    wrong.write_text("not-the-secret\n")

    def main_at_place_0():
        apgas.define_malleable_handler(Newest())
        key = auth.order_key_path(port)
        seen = []
        codes = {
            "status": main(["--to", to, "status"]),
            "keyed": main(["--to", to, "--key-file", str(key), "status"]),
            "refused": main(["--to", to, "shrink", "9"]),
            "plain": main(["--to", to, "--plain", "status"]),
            "wrong": main(["--to", to, "--key-file", str(wrong), "status"]),
        }
        first = send_order(("127.0.0.1", port), ["status"], on_first_line=lambda: seen.append(1))
        return codes, first, seen, key.exists()

    codes, first, seen, key_kept = apgas.run(main_at_place_0, places=1)
    out = capsys.readouterr().out.splitlines()
    assert codes == {"status": 0, "keyed": 0, "refused": 1, "plain": 1, "wrong": 1}
    assert out.count("status malleable 1") == 2
    assert any(line.startswith("error cannot shrink by 9") for line in out)
    assert any(line.startswith("error this job takes signed orders only") for line in out)
    assert "error bad signature on 'status'" in out
    assert first[0] == "status malleable 1" and seen == [1] and key_kept
    assert not auth.order_key_path(port).exists()  # the job removed its key at its end


def test_without_a_key_it_says_where_it_looked_and_what_to_pass(capsys, monkeypatch, tmp_path):
    """No key for the port: the CLI says so on stderr (the file it looked for, under
    APGAS_RUNTIME_DIR) and what to pass, then sends unsigned; the signing job's
    refusal names the key to sign with, not the command the user just ran."""
    port = free_port()
    monkeypatch.setenv("APGAS_MALLEABLE_LISTEN", f"127.0.0.1:{port}")
    elsewhere = tmp_path / "elsewhere"

    def main_at_place_0():
        apgas.define_malleable_handler(Newest())  # its key goes to the real runtime dir
        with monkeypatch.context() as m:
            m.setenv("APGAS_RUNTIME_DIR", str(elsewhere))
            return main(["--to", f"127.0.0.1:{port}", "status"])

    assert apgas.run(main_at_place_0, places=1) == 1
    out, err = capsys.readouterr()
    assert (f"no key found for the job on port {port}: looked in "
            f"{elsewhere / 'orders' / f'{port}.key'}") in err
    assert "there is no such file" in err and "pass --key-file PATH" in err and "--plain" in err
    assert out.startswith("error this job takes signed orders only, signed with its key "
                          "(python -m apgas.order --key-file PATH")


def test_help_shows_the_real_default_key_file(capsys, monkeypatch, tmp_path):
    """The default key file under --help is the one APGAS_RUNTIME_DIR gives."""
    monkeypatch.setenv("APGAS_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "1000")  # no line breaks inside the path
    with pytest.raises(SystemExit):
        main(["--help"])
    assert f"keeps in {tmp_path / 'orders' / 'PORT.key'};" in capsys.readouterr().out
