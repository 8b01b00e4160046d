"""A ZMQ refit stream whose receiver connects before the sender binds, as in every refit.

The driver asks the engine to receive and policy rank 0 to stream at once; the engine's
REP socket connects right away, while rank 0 first gathers the full weights and only
then binds. A connect that finds nothing bound is retried after the socket's reconnect
interval: ZMQ's default is 100 ms, ``harness.refit.zmq_common.RECONNECT_IVL_MS`` is 2.

Per arm and round: the receiver (this thread) connects, the sender (a thread) binds
``--bind-after-ms`` later and streams the reference model of a golden workload (default
the smoke one) in ``--buffer-bytes`` ping-pong buffers. Prints the median stream time
(receiver start to COMPLETE) of each arm and the ratio; timing decides nothing.

    python3 benches/refit_reconnect.py [--rounds 8] [--bind-after-ms 20] [--golden qwen3_moe_tiny_smoke]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

import torch
import zmq

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import reference_state_dict
from harness.refit.zmq_common import DEFAULT_TIMEOUT_MS, RECONNECT_IVL_MS, ipc_address, new_socket
from harness.refit.zmq_stream import receive_weights_zmq, send_weights_zmq
from harness.spec import load_spec


def one_stream(weights: dict[str, torch.Tensor], reconnect_ms: int, bind_after_s: float, buffer_bytes: int) -> float:
    """Seconds from the receiver's connect to COMPLETE; the received tensors are checked."""
    address = ipc_address(tempfile.mkdtemp(prefix="refit-bench-"), "r")
    info = {n: (tuple(t.shape), t.dtype) for n, t in weights.items()}
    received: dict[str, torch.Tensor] = {}
    errors: list[BaseException] = []

    def sender() -> None:
        time.sleep(bind_after_s)  # rank 0 gathers before it binds
        try:
            send_weights_zmq(weights.items(), address=address, buffer_size_bytes=buffer_bytes)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    socket = new_socket(zmq.REP, DEFAULT_TIMEOUT_MS, ipv6=False)
    socket.setsockopt(zmq.RECONNECT_IVL, reconnect_ms)  # the arm's interval
    start = time.perf_counter()
    socket.connect(address)
    thread = threading.Thread(target=sender)
    thread.start()
    try:
        receive_weights_zmq(address=address, state_dict_info=info, socket=socket,
                            load_fn=lambda views: received.update({n: v.clone() for n, v in views}))
        seconds = time.perf_counter() - start
    finally:
        thread.join(60)
        socket.close(linger=0)
    if errors:
        raise errors[0]
    if any(not torch.equal(received[n], t) for n, t in weights.items()):
        raise AssertionError("a tensor arrived changed")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--bind-after-ms", type=float, default=20.0)
    parser.add_argument("--golden", default="qwen3_moe_tiny_smoke")
    parser.add_argument("--buffer-bytes", type=int, default=65536)
    args = parser.parse_args()
    spec = load_spec(args.golden)
    weights = reference_state_dict(ModelConfig.from_spec(spec.model), spec.seed)
    arms = {"zmq default (100 ms)": 100, f"harness ({RECONNECT_IVL_MS} ms)": RECONNECT_IVL_MS}
    times: dict[str, list[float]] = {name: [] for name in arms}
    one_stream(weights, RECONNECT_IVL_MS, 0.0, args.buffer_bytes)  # warm-up (imports, first mappings)
    for _ in range(args.rounds):
        for name, ms in arms.items():  # side by side, alternating
            times[name].append(one_stream(weights, ms, args.bind_after_ms / 1000, args.buffer_bytes))
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    print(f"{args.golden}: {len(weights)} tensors, {nbytes} bytes, {args.buffer_bytes}-byte buffers, "
          f"sender binds {args.bind_after_ms:.0f} ms after the receiver connects, {args.rounds} rounds")
    medians = {name: statistics.median(v) for name, v in times.items()}
    for name, value in medians.items():
        print(f"  {name:<22} median {value * 1000:7.1f} ms")
    slow, fast = medians.values()
    print(f"  ratio default/harness: {slow / fast:.2f}")


if __name__ == "__main__":
    main()
