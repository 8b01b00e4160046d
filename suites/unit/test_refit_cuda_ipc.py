"""Refit staging by CUDA IPC handle (colocated engines on a GPU).

On the CPU box: the staging-device choice, the handle dispatch, the receiver
opening each CUDA buffer once per stream, and that host staging keeps its old
handle and message sequence. ``test_cuda_ipc_stream_between_processes``
needs a GPU (marker ``gpu``): a real CUDA IPC stream from this process to a
spawned receiver process, bit for bit.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading

import pytest
import torch

from harness.refit import staging, zmq_receiver, zmq_stream
from harness.refit.packing import pack, pack_into, packed_size, unpack_views
from harness.refit.zmq_stream import ACK, COMPLETE, ipc_address, receive_weights_zmq, send_weights_zmq

CUDA = torch.cuda.is_available()


def _state(seed: int = 0, device: str = "cpu") -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sd = {f"layer{i}.w": torch.randn(i * 31 + 3, generator=gen) for i in range(12)}
    sd["embed"] = torch.randn(40, 50, generator=gen)  # 8000 bytes: oversized for a 4 KiB budget
    sd["half"] = torch.randn(17, generator=gen).to(torch.bfloat16)
    return {k: v.to(device) for k, v in sd.items()}


def _info(sd):
    return {n: (tuple(t.shape), t.dtype) for n, t in sd.items()}


# -- CPU box -------------------------------------------------------------------------------
def test_staging_device_choice():
    assert zmq_stream._staging_device(None) is None
    assert zmq_stream._staging_device("cpu") is None
    with pytest.raises(ValueError, match="cpu or cuda"):
        zmq_stream._staging_device("meta")
    if not CUDA:
        with pytest.raises(ValueError, match="sees no CUDA device"):
            zmq_stream._staging_device("cuda")
        with pytest.raises(ValueError, match="sees no CUDA device"):
            send_weights_zmq([("a", torch.zeros(2))], address="ipc://unused", buffer_size_bytes=1024,
                             staging_device="cuda")


def test_cuda_buffer_refuses_a_host_device():
    with pytest.raises(ValueError, match="needs a cuda device"):
        staging.CudaStagingBuffer.create(64, "cpu")
    with pytest.raises(ValueError, match="must be positive"):
        staging.CudaStagingBuffer.create(0, "cuda")


def test_a_bad_cuda_handle_is_a_clear_error():
    handle = {"kind": staging.CUDA_IPC, "nbytes": 4096, "id": "x", "ipc": ("not", "a", "handle")}
    with pytest.raises(RuntimeError, match="CUDA IPC staging buffer of 4096 bytes could not be opened"):
        staging.open_staging(handle)


def test_host_handle_is_unchanged(tmp_path):
    """Host staging keeps its two-key handle (no ``kind``), so the CPU stream is the old one."""
    buf = staging.StagingBuffer.create(1024, str(tmp_path))
    try:
        assert set(buf.handle()) == {"path", "nbytes"}
        buf.ready()  # a no-op for host buffers
    finally:
        buf.release()


class _Script:
    """A REP-side socket double that replays sender messages and records the ACKs."""

    def __init__(self, messages):
        self.messages = list(messages)
        self.acks = 0

    def recv_pyobj(self):
        return self.messages.pop(0)

    def send(self, frame):
        assert frame == ACK
        self.acks += 1


def test_receiver_opens_each_cuda_buffer_once_per_stream(monkeypatch):
    """Two ping-pong CUDA buffers used for four groups: two opens, four ACKs, every
    tensor loaded from the right buffer. The IPC open itself is replaced by a host
    tensor here (no GPU on this box); the GPU test below opens real handles."""
    sd = _state()
    names = list(sd)
    groups = [names[0:3], names[3:6], names[6:9], names[9:14]]
    packed = {g: pack([sd[n] for n in names_]) for g, names_ in enumerate(groups)}
    opens = []

    def fake_open(handle):
        opens.append(handle["id"])
        return buffers[handle["id"]]

    buffers = {"A": torch.zeros(65536, dtype=torch.uint8), "B": torch.zeros(65536, dtype=torch.uint8)}
    monkeypatch.setattr(zmq_receiver, "open_staging", fake_open)

    class Feed(_Script):
        def recv_pyobj(self):
            message = super().recv_pyobj()
            if message != COMPLETE:  # the sender re-packs a buffer only after its ACK
                handle, group_names, used = message
                g = groups.index(list(group_names))
                buffers[handle["id"]][:used].copy_(packed[g])
            return message

    messages = [({"kind": staging.CUDA_IPC, "id": "AB"[g % 2], "nbytes": 65536}, groups[g], packed[g].numel())
                for g in range(4)] + [COMPLETE]
    socket = Feed(messages)
    received = {}
    receive_weights_zmq(address="ipc://unused", state_dict_info=_info(sd), socket=socket,
                        load_fn=lambda views: received.update({n: v.clone() for n, v in views}))
    assert opens == ["A", "B"]
    assert socket.acks == 5
    assert set(received) == set(sd)
    for name, t in sd.items():
        assert torch.equal(received[name], t), name


def _mixed(device: str = "cpu") -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return [t.to(device) for t in (
        torch.randn(5, 7, generator=gen), torch.randn(3, generator=gen).to(torch.bfloat16), torch.empty(0),
        torch.randn(6, 4, generator=gen).t(),  # non-contiguous
        torch.arange(9, dtype=torch.int64), torch.tensor([True, False, True]), torch.randn(130, generator=gen))]


def _foreach_spy(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = torch._foreach_copy_

    def spy(dst, src, *args, **kwargs):
        calls.append(len(dst))
        return real(dst, src, *args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_copy_", spy)
    return calls


@pytest.mark.parametrize("start", [0, 3])
def test_batched_pack_writes_the_loop_bytes(monkeypatch, start):
    """One ``_foreach_copy_`` per dtype lays out exactly the per-tensor loop's bytes (mixed
    dtypes, an empty and a non-contiguous tensor; a buffer view at an unaligned start too)."""
    tensors = _mixed()
    size = start + 8192
    loop, batched = torch.full((size,), 7, dtype=torch.uint8), torch.full((size,), 7, dtype=torch.uint8)
    calls = _foreach_spy(monkeypatch)
    used_loop = pack_into(loop[start:], tensors, batched=False)
    assert calls == []
    used_batched = pack_into(batched[start:], tensors, batched=True)
    assert used_batched == used_loop == packed_size(tensors)
    assert torch.equal(batched, loop)
    assert sorted(calls) == ([6] if start else [1, 1, 1, 3])  # bytes at an unaligned start; else per dtype (3 fp32)
    unpacked = unpack_views(batched[start:].clone(), [str(i) for i in range(len(tensors))],
                            {str(i): (tuple(t.shape), t.dtype) for i, t in enumerate(tensors)}, used_batched)
    for (_, view), t in zip(unpacked, tensors):
        assert torch.equal(view, t)


@pytest.mark.parametrize("start", [0, 3])
def test_one_dtype_group_packs_with_one_copy(monkeypatch, start):
    """A one-dtype group (the usual: all fp32 or all bf16): one ``_foreach_copy_`` whose
    destinations come from one split, the loop's bytes; tensors that require grad too."""
    gen = torch.Generator().manual_seed(6)
    tensors = [torch.randn(5, 7, generator=gen, requires_grad=True), torch.empty(0),
               torch.randn(6, 4, generator=gen).t(), torch.randn(130, generator=gen)]
    loop, batched = torch.zeros(start + 4096, dtype=torch.uint8), torch.zeros(start + 4096, dtype=torch.uint8)
    calls = _foreach_spy(monkeypatch)
    pack_into(loop[start:], tensors, batched=False)
    assert pack_into(batched[start:], tensors, batched=True) == packed_size(tensors)
    assert torch.equal(batched, loop) and not batched.requires_grad
    assert calls == [3]


@pytest.mark.parametrize("dtypes", [("f32",), ("f32", "bf16")])
def test_split_views_equal_the_per_tensor_views(dtypes):
    """``unpack_views(split=True)`` gives the per-tensor views exactly (same bytes, shape,
    strides, address) and the same errors; a mixed-dtype group keeps the per-tensor views."""
    kinds = {"f32": torch.float32, "bf16": torch.bfloat16}
    gen = torch.Generator().manual_seed(7)
    sd = {f"t{i}": torch.randn(shape, generator=gen).to(kinds[dtypes[i % len(dtypes)]])
          for i, shape in enumerate([(5, 7), (0,), (3, 4, 2), (130,), (1,)])}
    buffer = torch.zeros(8192, dtype=torch.uint8)
    used = pack_into(buffer, list(sd.values()))
    names, info = list(sd), _info(sd)
    loop = unpack_views(buffer, names, info, used, split=False)
    fast = unpack_views(buffer, names, info, used, split=True)
    for (name, a), (name_b, b) in zip(loop, fast):
        assert name == name_b and torch.equal(a, sd[name]) and torch.equal(b, sd[name])
        assert (a.shape, a.stride(), a.dtype, a.data_ptr()) == (b.shape, b.stride(), b.dtype, b.data_ptr())
    for split in (False, True):
        with pytest.raises(RuntimeError, match="receiver metadata implies"):
            unpack_views(buffer, names, info, used + 512, split=split)
        with pytest.raises(RuntimeError, match="packed buffer too small for 't2'"):
            unpack_views(buffer[:600], names, info, split=split)


def test_host_buffers_keep_the_per_tensor_loop(monkeypatch):
    """The CPU path is unchanged: a host buffer packs tensor by tensor unless asked."""
    calls = _foreach_spy(monkeypatch)
    pack_into(torch.zeros(8192, dtype=torch.uint8), _mixed())
    assert calls == []


# -- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (L2: ci/l2.sh on a GPU machine)")
def test_cuda_buffers_pack_batched_with_the_loop_bytes(monkeypatch):
    tensors = _mixed("cuda")
    loop, batched = torch.zeros(8192, dtype=torch.uint8, device="cuda"), torch.zeros(8192, dtype=torch.uint8,
                                                                                     device="cuda")
    calls = _foreach_spy(monkeypatch)
    pack_into(loop, tensors, batched=False)
    assert calls == []
    pack_into(batched, tensors)  # the default on a GPU buffer
    assert sorted(calls) == [1, 1, 1, 3]
    assert torch.equal(batched, loop)
    one = [t for t in tensors if t.dtype == torch.float32]
    calls.clear()
    used = pack_into(batched, one)
    assert calls == [3]
    info = {str(i): (tuple(t.shape), t.dtype) for i, t in enumerate(one)}
    for (_, view), t in zip(unpack_views(batched, list(info), info, used), one):  # split views on a GPU
        assert torch.equal(view, t)


def _receive_in_child(address: str, info: dict, queue) -> None:
    try:
        torch.cuda.set_device(0)
        got: dict = {}
        devices = set()

        def load(views):
            for name, view in views:
                devices.add(view.device.type)
                got[name] = view.clone()

        receive_weights_zmq(address=address, state_dict_info=info, load_fn=load, timeout_ms=60_000)
        queue.put({"devices": sorted(devices), "pid": os.getpid(),
                   "digest": {n: bytes(t.cpu().contiguous().view(torch.uint8).reshape(-1).numpy()).hex()
                              for n, t in got.items()}})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put({"error": repr(exc)})


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (L2: ci/l2.sh on a GPU machine)")
def test_cuda_ipc_stream_between_processes(tmp_path):
    sd = _state(3, "cuda")
    address = ipc_address(str(tmp_path), "cuda")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_receive_in_child, args=(address, _info(sd), queue))
    child.start()
    outcome = {}

    def sender():
        outcome["stats"] = send_weights_zmq(sd.items(), address=address, buffer_size_bytes=4096,
                                            timeout_ms=60_000, staging_device="cuda")

    thread = threading.Thread(target=sender)
    thread.start()
    result = queue.get(timeout=120)
    thread.join(60)
    child.join(60)
    assert "error" not in result, result
    assert result["devices"] == ["cuda"] and result["pid"] != os.getpid()
    assert outcome["stats"].oversized == 1 and outcome["stats"].groups > 2
    for name, t in sd.items():
        assert result["digest"][name] == bytes(t.cpu().contiguous().view(torch.uint8).reshape(-1).numpy()).hex()
