"""AWS's boot-script lines: the instance id from IMDSv2; a power-off terminates the instance
(``InstanceInitiatedShutdownBehavior=terminate``), so a node ends itself by powering off."""

from __future__ import annotations

from dataclasses import dataclass

CURL = "curl -sSf --retry 10 --retry-connrefused --retry-delay 2"


@dataclass(frozen=True)
class AwsBoot:
    """:class:`~rubberband.cloud.boot_dialect.BootDialect` of EC2."""

    cloud: str = "aws"
    backstop_s: float = 0.0
    api_url: str = ""

    def instance_id_lines(self, metadata_url: str) -> list[str]:
        return [
            f'IMDS_TOKEN="$({CURL} -X PUT {metadata_url}/latest/api/token '
            '-H "X-aws-ec2-metadata-token-ttl-seconds: 300")"',
            f'INSTANCE_ID="$({CURL} -H "X-aws-ec2-metadata-token: ${{IMDS_TOKEN}}" '
            f'{metadata_url}/latest/meta-data/instance-id)"',
            "unset IMDS_TOKEN",
        ]

    def self_delete_lines(self, *, metadata_url: str, api_url: str, console: str) -> list[str]:
        return []


AWS_BOOT = AwsBoot()
