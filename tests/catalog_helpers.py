"""Test harness for `rubberband catalog update aws`: a moto server that also sells prices.

moto 5.2 has no Price List (``pricing``) service, so :class:`FakePriceList` answers
``AWSPriceListService.GetProducts`` inside the moto server process, in front of moto's own
WSGI app; everything else (EC2 zones, offerings, spot history) is moto's. The CLI under test
runs in a subprocess and reaches the server through ``AWS_ENDPOINT_URL`` with fake credentials.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from moto.server import ThreadedMotoServer


def price_list_product(instance_type: str, region: str, usd_per_hour: float) -> str:
    """One GetProducts ``PriceList`` entry, shaped like AWS's (a JSON string)."""
    sku = f"SKU{abs(hash((instance_type, region))) % 10**8}"
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "sku": sku,
                "attributes": {
                    "instanceType": instance_type,
                    "regionCode": region,
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                    "preInstalledSw": "NA",
                    "capacitystatus": "Used",
                },
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    f"{sku}.JRTCKXETXF": {
                        "sku": sku,
                        "offerTermCode": "JRTCKXETXF",
                        "priceDimensions": {
                            f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "description": f"${usd_per_hour} per On Demand Linux {instance_type} Instance Hour",
                                "pricePerUnit": {"USD": f"{usd_per_hour:.10f}"},
                            }
                        },
                    }
                }
            },
        }
    )


class FakePriceList:
    """WSGI middleware: serves GetProducts from ``prices`` (type, region) -> $/h; passes the rest to moto.

    ``fail_with`` makes every GetProducts call answer that AWS error code (HTTP 400).
    ``calls`` records the filters of each call, so tests can check what was asked.
    """

    def __init__(self, app, prices: dict[tuple[str, str], float], fail_with: str | None = None) -> None:
        self.app = app
        self.prices = prices
        self.fail_with = fail_with
        self.calls: list[dict[str, str]] = []

    def __call__(self, environ, start_response):
        if not environ.get("HTTP_X_AMZ_TARGET", "").startswith("AWSPriceListService."):
            return self.app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        request = json.loads(environ["wsgi.input"].read(length) or b"{}")
        filters = {f["Field"]: f["Value"] for f in request.get("Filters", [])}
        self.calls.append(filters)
        if self.fail_with:
            body = json.dumps({"__type": self.fail_with, "message": "injected by the test harness"}).encode()
            start_response(
                "400 Bad Request", [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(body)))]
            )
            return [body]
        price = self.prices.get((filters.get("instanceType"), filters.get("regionCode")))
        products = [] if price is None else [price_list_product(filters["instanceType"], filters["regionCode"], price)]
        body = json.dumps({"FormatVersion": "aws_v1", "PriceList": products}).encode()
        start_response("200 OK", [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(body)))])
        return [body]


@contextmanager
def moto_with_prices(prices: dict[tuple[str, str], float], fail_with: str | None = None):
    """A running moto server on 127.0.0.1 whose Price List answers come from ``prices``."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        werkzeug_server = server._server  # the werkzeug server moto's thread serves from
        price_list = FakePriceList(werkzeug_server.app, prices, fail_with)
        werkzeug_server.app = price_list
        host, port = server.get_host_and_port()
        price_list.endpoint = f"http://{host}:{port}"
        yield price_list
    finally:
        server.stop()


def aws_env(endpoint: str, home: Path, *, credentials: bool = True) -> dict[str, str]:
    """A hermetic environment for the CLI: moto endpoint, fake (or no) credentials, no real config."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": str(home / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-aws-credentials"),
            "HOME": str(home),
            "RUBBERBAND_CATALOG_DIR": str(home / "catalogs"),
        }
    )
    if credentials:
        env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    return env
