"""sdpa.lab: the lab's experiments as Python functions returning the dicts of `--json`."""
import json
import os
import subprocess

import pytest

import sdpa

pytestmark = pytest.mark.skipif(not hasattr(sdpa, "lab"),
                                reason="the module was built without the lab (src/lab)")


def without_seconds(result):
    return {k: v for k, v in result.items() if k != "seconds"}


def cli_path():
    # <build>/python/sdpa/__init__.py: the program is <build>/sdpa
    here = os.path.dirname(os.path.dirname(os.path.abspath(sdpa.__file__)))
    path = os.path.join(os.path.dirname(here), "sdpa")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def test_experiments_listed():
    listed = sdpa.lab.experiments()
    names = [e["name"] for e in listed]
    assert "softmax" in names and len(names) == len(set(names))
    assert all(isinstance(e["summary"], str) and e["summary"] for e in listed)


def test_run_returns_the_common_form():
    r = sdpa.lab.run("softmax", seed=3)
    assert r["experiment"] == "softmax" and r["seed"] == 3 and r["mode"] == "quick"
    assert isinstance(r["seconds"], (int, float)) and r["seconds"] >= 0
    assert r["claims"] and all({"id", "claim", "verdict"} <= set(c) for c in r["claims"])
    assert isinstance(r["tables"], dict) and r["tables"]
    # Reproducible: the same seed gives the same dict, wall time aside.
    assert without_seconds(sdpa.lab.run("softmax", seed=3)) == without_seconds(r)
    text = sdpa.lab.text(r)
    assert r["claims"][0]["id"] in text


@pytest.mark.skipif(cli_path() is None, reason="the sdpa program is not built next to the module")
def test_same_dict_as_the_cli():
    r = subprocess.run([cli_path(), "lab", "softmax", "--seed", "2", "--json"],
                       capture_output=True, text=True, check=True)
    cli = json.loads(r.stdout)
    assert without_seconds(sdpa.lab.run("softmax", seed=2)) == without_seconds(cli)


def test_lab_errors():
    with pytest.raises(ValueError, match=r"^lab: expected an experiment name \(.*softmax"):
        sdpa.lab.run("no-such-experiment")
    with pytest.raises(ValueError, match=r"^lang: expected en or zh, got 'fr'"):
        sdpa.lab.run("softmax", lang="fr")
    with pytest.raises(ValueError, match=r"^threads: expected 0"):
        sdpa.lab.run("softmax", threads=5000)


def test_import_submodule():
    import sdpa.lab as lab  # noqa: F401  (registered in sys.modules by the extension)
    assert lab is sdpa.lab
