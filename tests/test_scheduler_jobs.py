"""Job files: every mistake is named with the file, the key and the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from apgas_scheduler.jobs import JobFileError, load_job_file, parse_job

GOOD = {"name": "j", "command": "python x.py", "class": "malleable", "min_nodes": 1,
        "max_nodes": 3, "walltime": 10}


def test_a_good_file(tmp_path):
    (tmp_path / "run").mkdir()
    path = tmp_path / "job.toml"
    path.write_text('name = "uts"\ncommand = ["python", "-m", "glb.apps", "uts"]\n'
                    'class = "rigid"\nnodes = 2\nwalltime = 30\ncwd = "run"\n[env]\nA = "1"\nB = 2\n')
    spec = load_job_file(path)
    assert (spec.name, spec.command, spec.cls, spec.min_nodes, spec.max_nodes, spec.walltime) == (
        "uts", ("python", "-m", "glb.apps", "uts"), "rigid", 2, 2, 30.0)
    assert spec.env == (("A", "1"), ("B", "2")) and spec.cwd == str(tmp_path / "run")
    assert parse_job(spec.to_dict()) == spec  # what submit sends comes back the same


def test_command_string_is_split_like_a_shell():
    assert parse_job(GOOD).command == ("python", "x.py")
    assert parse_job({**GOOD, "command": "echo 'a b'"}).command == ("echo", "a b")


@pytest.mark.parametrize("change, message", [
    ({"class": "elastic"}, "key 'class': must be one of ['rigid', 'moldable', 'malleable', 'evolving'], got 'elastic'"),
    ({"command": []}, "key 'command': must be a string or a non-empty list of strings, got []"),
    ({"command": "echo 'open"}, "key 'command': cannot split"),
    ({"walltime": 0}, "key 'walltime': must be a positive number of seconds, got 0"),
    ({"walltime": "1h"}, "key 'walltime': must be a positive number of seconds, got '1h'"),
    ({"min_nodes": 4}, "key 'max_nodes': must be >= min_nodes (4), got 3"),
    ({"min_nodes": 0}, "key 'min_nodes': must be a whole number >= 1, got 0"),
    ({"nodes": 2}, "key 'nodes': give nodes, or min_nodes and max_nodes, not both"),
    ({"env": {"A": True}}, "key 'env': must be a table"),
    ({"colour": "red"}, "key 'colour': unknown key"),
    ({"name": " "}, "key 'name': must be a non-empty string"),
])
def test_bad_values_are_named(change, message):
    with pytest.raises(JobFileError, match="^jobs/x.toml: ") as info:
        parse_job({**GOOD, **change}, "jobs/x.toml")
    assert message in str(info.value)


def test_every_unknown_key_is_named_at_once():
    with pytest.raises(JobFileError) as info:
        parse_job({**GOOD, "node": 2, "wallclock": 60}, "jobs/x.toml")
    assert "jobs/x.toml: keys 'node', 'wallclock': unknown keys; known keys: [" in str(info.value)
    with pytest.raises(JobFileError) as info:
        parse_job({**GOOD, **{f"k{i:02d}": 1 for i in range(25)}})
    assert "'k19' and 5 more: unknown keys" in str(info.value)


def test_missing_keys_and_sizes():
    with pytest.raises(JobFileError, match="key 'walltime' is missing"):
        parse_job({k: v for k, v in GOOD.items() if k != "walltime"})
    with pytest.raises(JobFileError, match="a rigid job needs nodes = N"):
        parse_job({**GOOD, "class": "rigid"})
    with pytest.raises(JobFileError, match="key 'max_nodes': is missing"):
        parse_job({k: v for k, v in GOOD.items() if k != "max_nodes"})


def test_unreadable_and_broken_files(tmp_path):
    with pytest.raises(JobFileError, match="nope.toml: cannot read"):
        load_job_file(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text('name = "x\n')
    with pytest.raises(JobFileError, match="broken.toml: not valid TOML"):
        load_job_file(broken)
    lost = tmp_path / "lost.toml"
    lost.write_text('name = "x"\ncommand = "true"\nclass = "rigid"\nnodes = 1\nwalltime = 1\n'
                    'cwd = "no/such/dir"\n')
    with pytest.raises(JobFileError, match="key 'cwd': no such directory"):
        load_job_file(lost)


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "examples" / "jobs").glob("*.toml")),
                         ids=lambda p: p.name)
def test_the_example_job_files_load(path):
    spec = load_job_file(path)
    assert spec.name == path.stem and Path(spec.cwd).resolve() == path.parent.parent.parent.resolve()
