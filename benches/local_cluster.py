"""A real multi-node Ray cluster on one machine, for trying cluster goldens without one.

    python3 benches/local_cluster.py [--nodes 2] [--cpus 4] [--gpus 0] -- golden check W --platform P

Starts a head and ``--nodes - 1`` worker raylets with Ray's own
``ray.cluster_utils.Cluster`` (each node its own raylet, object store and logical
``--cpus`` / ``--gpus``), runs the command after ``--`` with ``--ray-address
<head>`` appended, prints the command's wall time, and shuts the cluster down. The
command's exit code is this script's. A development aid (docs/cluster.md); on a
real cluster use ``ray start --head`` and ``ray start --address``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus", type=float, default=4)
    parser.add_argument("--gpus", type=float, default=0)
    args = parser.parse_args(own)
    if not cmd:
        parser.error("give the command after --")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from ray.cluster_utils import Cluster

    t = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.cpus, "num_gpus": args.gpus,
                                                             "include_dashboard": False})
    try:
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=args.cpus, num_gpus=args.gpus)
        cluster.wait_for_nodes()
        print(f"[local_cluster] {args.nodes} node(s) x {args.cpus:g} CPU up at {cluster.address} "
              f"in {time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)
        t = time.perf_counter()
        code = subprocess.run([*cmd, "--ray-address", cluster.address]).returncode
        print(f"[local_cluster] command exit {code}, wall {time.perf_counter() - t:.1f}s", file=sys.stderr,
              flush=True)
        return code
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
