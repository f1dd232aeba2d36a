"""``scripts/gpu-rehearsal``'s choices, without building anything: which installed packages stand
for the node's (linked from this venv, or fetched where they were built here), what keys its
cache, and that its offline environment leaves pip no way out. ``make test-gpu-rehearsal`` runs
the rehearsal itself."""
import os
import sysconfig
import types

from tests.scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
rehearsal = load_script("gpu-rehearsal", "gpu_rehearsal")


def dist(tag: str):
    text = f"Wheel-Version: 1.0\nTag: {tag}\n"
    return types.SimpleNamespace(read_text=lambda name: text if name == "WHEEL" else None)


def test_a_package_built_here_is_fetched_not_linked():
    assert rehearsal.built_here(dist("cp311-cp311-linux_x86_64"))
    assert not rehearsal.built_here(dist("cp311-cp311-manylinux_2_28_x86_64"))
    assert not rehearsal.built_here(dist("py3-none-any"))
    assert not rehearsal.built_here(types.SimpleNamespace(read_text=lambda name: None))


def test_the_node_set_is_the_list_less_what_this_venv_lacks():
    """This venv: h5py was built on parallel HDF5 here (fetched as the registry's wheel); torch,
    numpy, mpi4py, scikit-learn, xxhash, pytest are linked; what the node lacks stays out."""
    reuse, fetch = rehearsal.node_set(sysconfig.get_path("purelib"), rehearsal.listed())
    names = {rehearsal.normalise(d.metadata["Name"]) for d in reuse}
    assert {"torch", "numpy", "mpi4py", "scikit-learn", "xxhash", "pytest", "pytest-timeout", "tqdm"} <= names
    assert not names & {"pytest-mpi", "hpctrain", "simplejpeg", "mkdocs", "ruff", "cupy-cuda12x", "h5py"}
    assert [f.split("==")[0] for f in fetch] == ["h5py"]
    assert names | {"h5py"} <= rehearsal.listed()


def test_cache_keys_follow_what_goes_in():
    recipe = rehearsal.make_recipe("gpu-venv")
    assert recipe.startswith("gpu-venv:") and "_node_python.pth" in recipe and "--no-index" in recipe
    assert rehearsal.make_recipe("no-such-target") == ""
    assert rehearsal.digest("a", [1]) == rehearsal.digest("a", [1]) != rehearsal.digest("a", [2])


def test_the_offline_environment_leaves_pip_no_way_out(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/somewhere")
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    env = rehearsal.offline_env()
    assert env["PIP_NO_INDEX"] == "1" and "PIP_FIND_LINKS" not in env
    assert env["https_proxy"] == env["HTTPS_PROXY"] == env["http_proxy"] == "http://127.0.0.1:9"
    assert env["PIP_INDEX_URL"].startswith("http://127.0.0.1:9")
    assert "PYTHONPATH" not in env and "VIRTUAL_ENV" not in env
