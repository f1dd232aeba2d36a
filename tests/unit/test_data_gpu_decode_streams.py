"""The device decode path's streams and its probe, on CPU stand-ins (no GPU here).

``streams.API`` is the recording fake of ``tests/unit/fake_cuda.py`` (CPU tensors take the CUDA
code path) and nvJPEG a Pillow decode (``gpudecode.DEVICE_DECODE``): the loader's thread decodes
and cuts on a stream of its own and records an event there, never blocking on a stream; the
consumer's stream waits for that event and marks the batch as its own (``record_stream``)
before the model reads it. ``available()`` decodes a JPEG on the device rather than trusting
an import. What nvJPEG does on a real GPU has not run here: docs/gpus.md.
"""
import numpy as np
import pytest
import torch

from hpctrain.comm import streams
from hpctrain.data import decoders, gpudecode
from hpctrain.job.batches import device_batches
from tests.unit.fake_cuda import FakeCuda
from tests.unit.test_data_gpu_decode import pil_decode
from tests.unit.test_data_jpeg_loader import blobs, loader, shards  # noqa: F401 (fixtures)


def test_decode_on_the_loaders_stream_and_the_consumer_waits_for_its_event(shards, monkeypatch):  # noqa: F811
    monkeypatch.setattr(gpudecode, "DEVICE_DECODE", pil_decode)
    monkeypatch.setattr(decoders, "dct_scale", lambda *a, **k: 1)
    plain = [x for x, _ in loader(shards, 1, raw=True, decode="gpu", decode_device=torch.device("cpu"),
                                  prefetch=0).epoch(1, augment=True)]
    fake = FakeCuda()
    monkeypatch.setattr(streams, "API", fake)
    on_dev = loader(shards, 1, raw=True, decode="gpu", decode_device=torch.device("cpu"), prefetch=0)
    got = []
    for x, _ in on_dev.epoch(1, augment=True):
        log = list(fake.log)
        assert [e for e in log if e[0] in ("enter", "exit")] == [("enter", "side1"), ("exit", "side1")]
        (record,) = [e for e in log if e[0] == "record"]
        assert record[2] == "side1"             # the event is on the loader's stream
        assert not any(e[0] in ("stream sync", "event sync", "host read") for e in log), log
        fake.log.clear()
        ((x_dev, _),) = list(device_batches([(x, torch.zeros(len(x)))], torch.device("cpu")))
        assert fake.log == [("wait_event", "compute", record[1]), ("record_stream", "compute")]
        assert not hasattr(x_dev, "decoded_event")
        fake.log.clear()
        got.append(x_dev)
    assert len(got) == len(plain) and all(torch.equal(a, b) for a, b in zip(got, plain))


def test_auto_probes_the_decode_operator_itself(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def broken(data, device):
        raise RuntimeError("operator torchvision::decode_jpegs_cuda is not available")
    for decode, want in ((broken, False), (pil_decode, True)):
        gpudecode.probe.cache_clear()
        monkeypatch.setattr(gpudecode, "DEVICE_DECODE", decode)
        monkeypatch.setattr(torch, "device", lambda d, _real=torch.device: _real("cpu") if d == "cuda" else _real(d))
        assert gpudecode.available() is want
        ok, why = gpudecode.probe()
        assert ok is want and (want or "decode_jpegs_cuda is not available" in why)
    gpudecode.probe.cache_clear()


def test_stored_bytes_reach_the_decoder_without_a_copy():
    blob = np.frombuffer(gpudecode.PROBE_JPEG, np.uint8).copy()
    t = gpudecode.byte_tensor(blob)
    assert t.data_ptr() == blob.ctypes.data and t.dtype == torch.uint8
    assert bytes(gpudecode.byte_tensor(gpudecode.PROBE_JPEG).numpy()) == gpudecode.PROBE_JPEG


@pytest.fixture(autouse=True)
def _fresh_probe():
    yield
    gpudecode.probe.cache_clear()
