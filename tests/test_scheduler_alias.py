"""The old package name ``scheduler`` still works for one release, and says so."""
import subprocess
import sys
import warnings


def test_old_import_names_are_the_new_modules_and_warn():
    sys.modules.pop("scheduler", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import scheduler
        from scheduler.policies import get_policy
    import apgas_scheduler.policies
    assert get_policy is apgas_scheduler.policies.get_policy
    assert scheduler.JobSpec is apgas_scheduler.JobSpec
    assert any("apgas_scheduler" in str(w.message) for w in caught)


def test_old_command_runs_the_new_one():
    out = subprocess.run([sys.executable, "-m", "scheduler", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "python -m apgas_scheduler" in out.stdout
    assert "now 'python -m apgas_scheduler'" in out.stderr
