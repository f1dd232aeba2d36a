"""hpctrain.ddp's rendezvous choices that need no second rank: the address rank 0 advertises,
the backend, MASTER_PORT's check."""
import pytest

from hpctrain.ddp import process_group as pg


@pytest.fixture(autouse=True)
def no_addr(monkeypatch):
    for var in ("MASTER_ADDR", "MASTER_PORT", "HPCTRAIN_NODE_ADDR"):
        monkeypatch.delenv(var, raising=False)


def test_one_host_is_loopback():
    assert pg.advertised_host(["n1", "n1", "n1"]) == "127.0.0.1"


def test_environment_wins(monkeypatch):
    monkeypatch.setenv("HPCTRAIN_NODE_ADDR", "10.0.0.5")
    assert pg.advertised_host(["n1", "n2"]) == "10.0.0.5"
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    assert pg.advertised_host(["n1", "n2"]) == "10.0.0.7"


def test_several_hosts_give_the_interface_towards_them():
    # the route to another host is found without sending anything; towards localhost it is loopback
    assert pg.advertised_host(["n1", "localhost"]).startswith("127.")


def test_master_port_is_checked(monkeypatch):
    assert pg._port() == 0
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert pg._port() == 29500
    monkeypatch.setenv("MASTER_PORT", "70000")
    with pytest.raises(pg.RendezvousError, match="MASTER_PORT='70000'"):
        pg._port()


def test_backend_without_cuda(monkeypatch):
    monkeypatch.setattr(pg.torch.cuda, "is_available", lambda: False)
    assert pg.default_backend() == "gloo"
