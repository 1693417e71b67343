"""GCP's boot-script lines: the instance's name from the metadata server; a node ends itself by deleting its VM
through the Compute Engine API — a GCE VM that only powers itself off is stopped (TERMINATED), not deleted: no
``maxRunDuration`` applies any more, and its disk, the run's rules and NAT stay until ``down``. Its own power-offs
therefore come :data:`GCP_BACKSTOP_S` after the deletion they back up, never first."""

from __future__ import annotations

from dataclasses import dataclass

from rubberband.cloud.shell import shell_word

#: The Compute Engine API a node ending itself deletes itself through.
COMPUTE_URL = "https://compute.googleapis.com"
#: How long after the moment Compute Engine (``maxRunDuration``) or the node watchdog (through the API) deletes a VM
#: its own power-off comes, as a backstop.
GCP_BACKSTOP_S = 600.0
CURL = "curl -sSf --retry 10 --retry-connrefused --retry-delay 2"


@dataclass(frozen=True)
class GcpBoot:
    """:class:`~rubberband.cloud.boot_dialect.BootDialect` of Compute Engine."""

    cloud: str = "gcp"
    backstop_s: float = GCP_BACKSTOP_S
    api_url: str = COMPUTE_URL

    def instance_id_lines(self, metadata_url: str) -> list[str]:
        return [f'INSTANCE_ID="$({CURL} -H "Metadata-Flavor: Google" {metadata_url}/computeMetadata/v1/instance/name)"']

    def self_delete_lines(self, *, metadata_url: str, api_url: str, console: str) -> list[str]:
        """``self_delete`` deletes this VM through the Compute Engine API with its service account's token from the
        metadata server (the head's: its binding allows its own VM), then waits until the VM is gone (the deletion
        shuts this machine down on the way). It fails (and ``off`` powers off) where the VM has no service account —
        workers have none: the head, or ``down``, deletes them — or where the API refuses or does not answer. The
        token stays in a shell variable; nothing prints it."""
        metadata = shell_word(f"{metadata_url.rstrip('/')}/computeMetadata/v1")
        api = shell_word(f"{api_url.rstrip('/')}/compute/v1/projects/")
        ask = "curl -sf -m 10 -H 'Metadata-Flavor: Google'"
        token = r"""sed -n 's/.*"access_token" *: *"\([^"]*\)".*/\1/p'"""
        gone = r"""[ "$(curl -s -o /dev/null -w '%{http_code}' -m 10 -H "Authorization: Bearer $tok" "$api")" = 404 ]"""
        return [
            "self_delete() {",
            "  local tok name zone project api",
            f'  tok="$({ask} {metadata}/instance/service-accounts/default/token | {token})"',
            '  [ -n "$tok" ] || return 1',
            f'  name="$({ask} {metadata}/instance/name)" && zone="$({ask} {metadata}/instance/zone)" && '
            f'project="$({ask} {metadata}/project/project-id)" || return 1',
            f'  api={api}"$project/zones/${{zone##*/}}/instances/$name"',
            '  curl -sf -m 30 -X DELETE -H "Authorization: Bearer $tok" "$api" >/dev/null || return 1',
            '  echo "rubberband-boot: $(date -u +%H:%M:%S) watchdog: deleting this VM through the Compute Engine API" '
            f">> {shell_word(console)} 2>/dev/null || true",
            f"  for _ in $(seq 1 24); do sleep 5 || true; {gone} && return 0; done",
            "  return 1",
            "}",
        ]


GCP_BOOT = GcpBoot()
