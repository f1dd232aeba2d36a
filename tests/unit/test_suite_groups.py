"""The serial suite's distribution (tests/conftest.py): under ``--dist loadgroup`` the tests that
share a module- or class-scoped fixture form one xdist group (the fixture is made once, on one
worker); every other test stays ungrouped, free to go to whichever worker is idle."""
import types

import pytest

from tests import conftest


def item(nodeid, **scopes):
    defs = {name: [types.SimpleNamespace(scope=scope)] for name, scope in scopes.items()}
    it = types.SimpleNamespace(nodeid=nodeid, _fixtureinfo=types.SimpleNamespace(name2fixturedefs=defs), marks=[])
    it.add_marker = it.marks.append
    return it


def groups(it):
    return [m.args[0] for m in it.marks if m.name == "xdist_group"]


def test_a_shared_fixture_groups_its_file_and_nothing_else_is_grouped():
    shared = item("tests/integration/test_x.py::test_a[1]", tmp_path="function", run="module")
    in_class = item("tests/unit/test_y.py::TestZ::test_b", data="class")
    alone = item("tests/unit/test_y.py::test_c", tmp_path="function", digits_dir="session")
    conftest.pytest_collection_modifyitems(None, [shared, in_class, alone])
    assert groups(shared) == ["tests/integration/test_x.py"]
    assert groups(in_class) == ["tests/unit/test_y.py"]
    assert groups(alone) == []          # a session fixture is made once per worker anyway


@pytest.mark.parametrize("mark", ["alone", "slow", "gpu"])
def test_the_suites_markers_are_registered(pytestconfig, mark):
    assert any(line.startswith(f"{mark}:") for line in pytestconfig.getini("markers"))
