"""Cost of rubberband's own cloud plumbing, measured against a local moto server (no account).

Prints the wall time of: provisioning a gang directly, provisioning through failover when the first
zones are sold out (each failed attempt adds one API round trip and nothing else), waiting until
running, and tearing the run down (terminate + security-group deletion). These are client-side
overheads only: real EC2 adds its own queueing and boot latency, which the planner models separately.

    python bench/cloud_failover.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

from moto.server import ThreadedMotoServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
        AWS_ACCESS_KEY_ID="AKIABENCHBENCHBENCH0",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.instances import InstanceBackend

    from rubberband.catalog import load_catalog
    from rubberband.cloud.aws.provider import AwsProvider
    from rubberband.cloud.failover import provision_with_failover
    from rubberband.cloud.provider import InstanceRequest
    from rubberband.cloud.teardown import terminate_run

    sold_out: set[str] = set()
    original = InstanceBackend.run_instances

    def run_instances(self, image_id, count, user_data, security_group_names, **kwargs):
        if kwargs.get("placement") in sold_out:
            raise EC2ClientError("InsufficientInstanceCapacity", "sold out")
        return original(self, image_id, count, user_data, security_group_names, **kwargs)

    InstanceBackend.run_instances = run_instances  # type: ignore[method-assign]
    p3 = load_catalog(["aws"]).find("p3.2xlarge")
    p3 = dataclasses.replace(p3, zones=("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"))
    provider = AwsProvider("us-east-1", image_id="ami-12c6146b", poll_s=0.01)
    provider.list()  # first call warms moto's EC2 backend
    figures: dict[str, list[float]] = {}
    try:
        for rep in range(args.repeat):
            for failures in (0, 3):
                sold_out.clear()
                sold_out.update(p3.zones[:failures])
                run_id = f"bench-{rep}-{failures}"
                start = time.perf_counter()
                result = provision_with_failover(InstanceRequest(run_id, 0, p3, count=4), lambda t: provider)
                figures.setdefault(f"provision 4x, {failures} zones sold out", []).append(time.perf_counter() - start)
                start = time.perf_counter()
                provider.wait([i.id for i in result.instances], 30)
                figures.setdefault("wait until running", []).append(time.perf_counter() - start)
                start = time.perf_counter()
                terminate_run(provider, run_id, timeout_s=30)
                figures.setdefault("terminate_run (4 instances + group)", []).append(time.perf_counter() - start)
    finally:
        server.stop()
    base = statistics.median(figures["provision 4x, 0 zones sold out"])
    for name, values in figures.items():
        print(f"{name:40s} median {statistics.median(values) * 1000:7.1f} ms  (n={len(values)})")
    failover = statistics.median(figures["provision 4x, 3 zones sold out"])
    print(
        f"failover overhead per sold-out zone: {(failover - base) / 3 * 1000:.1f} ms "
        f"(ratio 3-failures / direct = {failover / base:.2f})"
    )


if __name__ == "__main__":
    main()
