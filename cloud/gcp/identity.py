"""The GCP head's identity: the user's service account, the custom role bound to it for one run, and the checks.

``--service-account EMAIL`` is required, and a custom role ``rubberbandHead`` (:data:`GCP_HEAD_PERMISSIONS`) made once
(docs/clouds.md; rubberband creates no service account or role). The CLI binds that role to the account for each run
alone (:func:`bind_head_role`), conditioned on the run's own resource names (:func:`gcp_head_condition`), and removes
the binding when the run ends (:meth:`GcpIdentities.unbind_run`; the orphan sweep: :meth:`GcpIdentities.leftover_runs`).
The dry run's check (:meth:`GcpIdentities.check_service_account`) reads the project's IAM policy and the roles bound to
the account.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from rubberband.cloud.head_identity import HeadIdentity
from rubberband.cloud.provider import PermissionCheck
from rubberband.errors import CloudError, InputError
from rubberband.cloud.failover import CallContext, classify


#: Permissions the head's service account needs on GCP (docs/clouds.md: the custom role ``rubberbandHead``).
GCP_HEAD_PERMISSIONS = (
    "compute.instances.create",
    "compute.instances.delete",
    "compute.instances.get",
    "compute.instances.list",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setTags",
    "compute.instances.setScheduling",
    "compute.disks.create",
    "compute.disks.setLabels",
    "compute.disks.list",
    "compute.disks.delete",
    "compute.subnetworks.create",
    "compute.subnetworks.delete",
    "compute.subnetworks.get",
    "compute.subnetworks.list",
    "compute.subnetworks.use",
    "compute.subnetworks.useExternalIp",
    "compute.networks.updatePolicy",
    "compute.firewalls.create",
    "compute.firewalls.delete",
    "compute.firewalls.get",
    "compute.firewalls.list",
    "compute.routers.create",
    "compute.routers.delete",
    "compute.routers.get",
    "compute.routers.list",
    "compute.zoneOperations.get",
    "compute.zoneOperations.list",
    "compute.globalOperations.get",
    "compute.regionOperations.get",
    "compute.images.useReadOnly",
)
#: The custom role the head's service account is bound to, run by run (created once by you: docs/clouds.md).
GCP_HEAD_ROLE_ID = "rubberbandHead"
#: What the CLI needs on GCP to bind the head's role to its service account for a run, and to remove that binding.
GCP_BINDING_PERMISSIONS = ("resourcemanager.projects.getIamPolicy", "resourcemanager.projects.setIamPolicy")
#: What the CLI needs on GCP besides the head's permissions: attach the head's service account to the head (plus
#: ``iam.serviceAccounts.actAs`` on that account, checked on the account itself), read the head's serial console,
#: where the CLI reads its SSH host keys before connecting (cloud/host_keys.py), and bind its role for the run.
GCP_CLI_PERMISSIONS = (
    *GCP_HEAD_PERMISSIONS,
    "compute.instances.setServiceAccount",
    "compute.instances.getSerialPortOutput",
    *GCP_BINDING_PERMISSIONS,
)


#: The resource types whose names the head's binding narrows to the run's own (others — the project a list call
#: names, operations, images, the network — it does not narrow).
GCP_NAMED_KINDS = ("Instance", "Disk", "Firewall", "Router", "Subnetwork")
#: The network's own subnetwork, which workers use with ``--worker-egress existing`` or ``public``.
GCP_NETWORK_SUBNETWORK = "default"
#: How the title of a run's binding begins (``rubberband-run-<run>``): the binding is found by it and its marker.
GCP_BINDING_TITLE = "rubberband-run-"


def _typed(kind: str, test: str) -> str:
    return f'(resource.type == "compute.googleapis.com/{kind}" && {test})'


def _named(collection: str, names: Iterable[str]) -> str:
    """CEL: the resource's name is one of ``names`` (``endsWith`` of ``/<collection>/<name>``: exact, since no name
    holds a ``/``)."""
    return "(" + " || ".join(f'resource.name.endsWith("/{collection}/{name}")' for name in names) + ")"


def gcp_head_condition(run_id: str, *, worker_egress: str | None = None) -> str:
    """The IAM condition (CEL) of the head's role binding for one run: of the kinds rubberband creates
    (:data:`GCP_NAMED_KINDS`) only the run's own — its VMs and their boot disks (names starting ``rb-<run>-``), its
    firewall rules, its workers' Cloud Router and subnetwork (their exact names); with ``worker_egress`` ``existing``
    or ``public`` also the network's own subnetwork, which its workers then use. Other resource types are not
    narrowed. IAM conditions offer ``startsWith``, ``endsWith`` and ``extract`` on resource names, nothing else.

    One caveat of a prefix: a run whose id is this one's followed by ``-…`` (run ``a`` and run ``a-1``) would match its
    VM names; rubberband's run ids end in a time stamp and a random suffix, so no run's id extends another's."""
    from rubberband.cloud.gcp.names import FIREWALL_KINDS, firewall_name, instance_prefix, router_name, subnet_name

    prefix = instance_prefix(run_id)
    subnetworks = [subnet_name(run_id)]
    if worker_egress in ("existing", "public"):
        subnetworks.append(GCP_NETWORK_SUBNETWORK)
    clauses = [
        "(" + " && ".join(f'resource.type != "compute.googleapis.com/{kind}"' for kind in GCP_NAMED_KINDS) + ")",
        _typed("Instance", f'resource.name.extract("/instances/{{name}}").startsWith("{prefix}")'),
        _typed("Disk", f'resource.name.extract("/disks/{{name}}").startsWith("{prefix}")'),
        _typed("Firewall", _named("firewalls", [firewall_name(run_id, kind) for kind in FIREWALL_KINDS])),
        _typed("Router", _named("routers", [router_name(run_id)])),
        _typed("Subnetwork", _named("subnetworks", subnetworks)),
    ]
    return " || ".join(clauses)


def gcp_head_binding(
    project: str, email: str, run_id: str, *, worker_egress: str | None = None, now: float | None = None
) -> dict[str, Any]:
    """The project IAM policy binding the CLI adds for a run: the head's role (:data:`GCP_HEAD_ROLE_ID`) to its
    service account, conditioned on the run (:func:`gcp_head_condition`); its title names the run, its description
    ends in the run's ownership marker and says when it was bound (the sweep's age)."""
    from rubberband.cloud.gcp.names import owner_marker

    bound = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    return {
        "role": f"projects/{project}/roles/{GCP_HEAD_ROLE_ID}",
        "members": [f"serviceAccount:{email}"],
        "condition": {
            "title": f"{GCP_BINDING_TITLE}{run_id}",
            "description": f"rubberband: the head of run {run_id} on its own resources, bound {bound} "
            f"{owner_marker(run_id)}",
            "expression": gcp_head_condition(run_id, worker_egress=worker_egress),
        },
    }


#: The head's binding condition for a run called ``RUN`` with the default egress (docs/clouds.md prints it).
GCP_HEAD_CONDITION = gcp_head_condition("RUN")


class GcpIdentities:
    """The head's service account on GCP: bind its role (:data:`GCP_HEAD_ROLE_ID`) to it for one run, conditioned on
    that run (:func:`gcp_head_binding`), remove that binding when the run ends, find bindings whose run left nothing,
    and check the account for the dry run. REST calls to the IAM and Resource Manager APIs with the same credentials as
    Compute Engine (``RUBBERBAND_GCE_ENDPOINT`` redirects them too, for tests). The project's IAM policy is changed
    read-modify-write, conditioned on its etag: a write that raced another is read and made again."""

    IAM = "https://iam.googleapis.com"
    CRM = "https://cloudresourcemanager.googleapis.com"
    #: How often a policy write that raced another writer is made again.
    WRITE_TRIES = 5

    def __init__(self, project: str | None = None, *, endpoint: str | None = None, session: Any = None) -> None:
        from rubberband.cloud.gcp.session import ENDPOINT_ENV, PROJECT_ENV

        endpoint = endpoint or os.environ.get(ENDPOINT_ENV) or None
        self.iam_url, self.crm_url = (endpoint, endpoint) if endpoint else (self.IAM, self.CRM)
        if session is None:
            import requests

            default_project: str | None
            if endpoint:
                session, default_project = requests.Session(), "rubberband-test"
            else:
                import google.auth
                from google.auth.transport.requests import AuthorizedSession

                credentials, default_project = google.auth.default(
                    scopes=["https://www.googleapis.com/auth/cloud-platform"]
                )
                session = AuthorizedSession(credentials)
            project = project or os.environ.get(PROJECT_ENV) or default_project
        if not project:
            raise InputError("no GCP project: set RUBBERBAND_GCP_PROJECT or `gcloud config set project`")
        self.project: str = project
        self.session = session

    def _json(self, method: str, url: str, body: dict | None = None) -> tuple[int, dict]:
        response = self.session.request(method, url, json=body, timeout=30)
        try:
            data = response.json()
        except ValueError:
            data = {}
        return response.status_code, data

    # -- the run's binding ----------------------------------------------------------------------------

    def _failed(self, permission: str, status: int, data: dict) -> CloudError:

        error = data.get("error") or {}
        code = "UnauthorizedOperation" if status in (401, 403) else str(error.get("status") or status)
        context = CallContext("gcp", action=permission)
        return classify(code, str(error.get("message") or f"HTTP {status}"), context, http_status=status)

    def _policy(self) -> dict[str, Any]:
        """The project's IAM policy, conditional bindings included (version 3; an older version would show them
        under made-up role names)."""
        status, policy = self._json(
            "POST",
            f"{self.crm_url}/v1/projects/{self.project}:getIamPolicy",
            {"options": {"requestedPolicyVersion": 3}},
        )
        if status >= 400:
            raise self._failed("resourcemanager.projects.getIamPolicy", status, policy)
        return policy

    def _update(self, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None]) -> bool:
        """Apply ``change`` (bindings → new bindings, or None: nothing to do) to the project's policy; True when it
        wrote. A write refused because the policy changed in between (HTTP 409, its etag) is made again afresh."""
        for attempt in range(self.WRITE_TRIES):
            policy = self._policy()
            bindings = change([dict(b) for b in policy.get("bindings", [])])
            if bindings is None:
                return False
            body = {"policy": {**policy, "bindings": bindings, "version": 3}}
            status, data = self._json("POST", f"{self.crm_url}/v1/projects/{self.project}:setIamPolicy", body)
            if status == 409 and attempt < self.WRITE_TRIES - 1:
                continue
            if status >= 400:
                raise self._failed("resourcemanager.projects.setIamPolicy", status, data)
            return True
        raise AssertionError("unreachable")  # pragma: no cover

    def bind_run(self, email: str, run_id: str, *, worker_egress: str | None = None) -> None:
        """Bind the head's role to ``email`` for ``run_id`` alone (:func:`gcp_head_binding`); a binding of the run
        already there (a retried start) is kept as it is."""
        binding = gcp_head_binding(self.project, email, run_id, worker_egress=worker_egress)
        title = binding["condition"]["title"]

        def add(bindings: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
            if any(_run_binding(b) == run_id and (b.get("condition") or {}).get("title") == title for b in bindings):
                return None
            return [*bindings, binding]

        self._update(add)

    def unbind_run(self, run_id: str) -> list[str]:
        """Remove the run's binding (found by its title and marker, never by the role or account); what was removed,
        as ``iam-binding/<title>``."""
        removed: list[str] = []

        def drop(bindings: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
            removed[:] = [f"iam-binding/{b['condition']['title']}" for b in bindings if _run_binding(b) == run_id]
            return [b for b in bindings if _run_binding(b) != run_id] if removed else None

        self._update(drop)
        return removed

    def leftover_runs(self, live: set[str], *, older_than_s: float = 0.0, now: float | None = None) -> list[str]:
        """Runs with a binding here but no instance left (``live``: the runs that have one), bound at least
        ``older_than_s`` before ``now`` (a run being started keeps its young binding)."""
        now = time.time() if now is None else now
        runs = set()
        for binding in self._policy().get("bindings", []):
            run_id = _run_binding(binding)
            bound = _bound_at(binding)
            if run_id and run_id not in live and (bound is None or now - bound >= older_than_s):
                runs.add(run_id)
        return sorted(runs)

    # -- the dry run ---------------------------------------------------------------------------------------

    def test_permissions(self, permissions: Iterable[str]) -> list[PermissionCheck]:
        """Which of ``permissions`` the caller holds on the project (``projects.testIamPermissions``, 100 a call)."""
        wanted = list(permissions)
        held: set[str] = set()
        for start in range(0, len(wanted), 100):
            status, data = self._json(
                "POST",
                f"{self.crm_url}/v1/projects/{self.project}:testIamPermissions",
                {"permissions": wanted[start : start + 100]},
            )
            if status >= 400:
                return [
                    PermissionCheck("gcp", "global", p, None, f"you: testIamPermissions answered HTTP {status}")
                    for p in wanted
                ]
            held |= set(data.get("permissions", []))
        return [PermissionCheck("gcp", "global", p, p in held, "you (the CLI)") for p in wanted]

    def check_service_account(self, email: str) -> list[PermissionCheck]:
        """The account exists, the CLI may attach it, the head's role grants every permission the head needs, and no
        binding of the account grants any of them beyond a run (broader than rubberband needs: reported)."""
        what = f"head service account {email}"
        status, _ = self._json("GET", f"{self.iam_url}/v1/projects/{self.project}/serviceAccounts/{email}")
        if status == 404:
            raise InputError(
                f"--service-account {email}: no such service account in project {self.project}; "
                f"create it with the role in docs/clouds.md"
            )
        if status >= 400:
            return [
                PermissionCheck(
                    "gcp", "global", "iam.serviceAccounts.get", None, f"{what}: HTTP {status} (not checked)"
                )
            ]
        checks = []
        status, data = self._json(
            "POST",
            f"{self.iam_url}/v1/projects/{self.project}/serviceAccounts/{email}:testIamPermissions",
            {"permissions": ["iam.serviceAccounts.actAs"]},
        )
        if status < 400:
            allowed = "iam.serviceAccounts.actAs" in data.get("permissions", [])
            checks.append(
                PermissionCheck(
                    "gcp",
                    "global",
                    "iam.serviceAccounts.actAs",
                    allowed,
                    f"the CLI on {email} (roles/iam.serviceAccountUser)",
                )
            )
        return checks + self._check_role(what) + self._check_broader(email, what)

    def _role_permissions(self, role: str) -> set[str] | None:
        """The permissions a role grants (predefined ``roles/NAME`` and custom ``projects/P/roles/NAME`` alike), or
        None when it cannot be read."""
        status, data = self._json("GET", f"{self.iam_url}/v1/{role}")
        return set(data.get("includedPermissions", [])) if status < 400 else None

    def _check_role(self, what: str) -> list[PermissionCheck]:
        """The head's role exists and grants every permission the head needs (bound per run by the CLI)."""
        role = f"projects/{self.project}/roles/{GCP_HEAD_ROLE_ID}"
        granted = self._role_permissions(role)
        if granted is None:
            return [
                PermissionCheck("gcp", "global", p, False, f"{what}: no role {role} (create it: docs/clouds.md)")
                for p in GCP_HEAD_PERMISSIONS
            ]
        detail = f"{what} through role {GCP_HEAD_ROLE_ID}, bound per run"
        return [PermissionCheck("gcp", "global", p, p in granted, detail) for p in GCP_HEAD_PERMISSIONS]

    def _check_broader(self, email: str, what: str) -> list[PermissionCheck]:
        """A binding of the account that grants any of the head's Compute Engine permissions and is not a run's own
        (unconditional, or conditioned on something else): the head of every run could use it."""
        status, policy = self._json(
            "POST",
            f"{self.crm_url}/v1/projects/{self.project}:getIamPolicy",
            {"options": {"requestedPolicyVersion": 3}},
        )
        if status >= 400:
            return [
                PermissionCheck(
                    "gcp", "global", "resourcemanager.projects.getIamPolicy", None, f"{what}: HTTP {status}"
                )
            ]
        checks = []
        for binding in policy.get("bindings", []):
            if f"serviceAccount:{email}" not in binding.get("members", []) or _run_binding(binding):
                continue
            granted = (self._role_permissions(binding["role"]) or set()) & set(GCP_HEAD_PERMISSIONS)
            if granted:
                title = (binding.get("condition") or {}).get("title")
                scope = f"with condition {title!r}" if title else "unconditionally"
                checks.append(
                    PermissionCheck(
                        "gcp",
                        "global",
                        binding["role"],
                        True,
                        f"{what} holds {binding['role']} {scope} ({', '.join(sorted(granted)[:3])}, …) beyond any "
                        f"run: broader than rubberband needs, which binds the head's role per run (docs/clouds.md); "
                        f"remove that binding",
                        expect="deny",
                    )
                )
        return checks


def _run_binding(binding: dict[str, Any]) -> str | None:
    """The run a policy binding was made for by rubberband (its title and its description's marker), else None."""
    from rubberband.cloud.gcp.names import marked_run

    condition = binding.get("condition") or {}
    run_id = marked_run(condition.get("description"))
    return run_id if run_id and condition.get("title") == f"{GCP_BINDING_TITLE}{run_id}" else None


def _bound_at(binding: dict[str, Any]) -> float | None:
    """When rubberband made a run's binding (its description says), POSIX seconds; None if it does not say."""
    import calendar
    import re

    found = re.search(
        r"bound (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)", (binding.get("condition") or {}).get("description", "")
    )
    return float(calendar.timegm(time.strptime(found.group(1), "%Y-%m-%dT%H:%M:%SZ"))) if found else None


def check_cli_permissions(project: str | None = None, *, endpoint: str | None = None) -> list[PermissionCheck]:
    """GCP: ``projects.testIamPermissions`` of the CLI's own credentials for :data:`GCP_CLI_PERMISSIONS`."""
    return GcpIdentities(project, endpoint=endpoint).test_permissions(GCP_CLI_PERMISSIONS)


GCP_NEEDS_ACCOUNT = (
    "--cloud gcp runs the executor on a head instance that needs a service account: pass "
    "--service-account EMAIL (one holding the role in docs/clouds.md), or run with --head local"
)


def bind_head_role(identity: HeadIdentity, run_id: str, *, worker_egress: str | None = None) -> HeadIdentity:
    """GCP: bind the head's role to the run's service account for this run alone (:meth:`GcpIdentities.bind_run`);
    the identity comes back marked ``created``, so the run's end removes the binding (:func:`delete_run_identity`).
    IAM applies a new binding within a minute or two, well before the head's executor makes its first call."""
    GcpIdentities().bind_run(identity.name, run_id, worker_egress=worker_egress)
    return HeadIdentity("gcp", identity.name, created=True)


def policy_docs() -> str:
    """The GCP role and condition as docs/clouds.md prints them (between its ``policies`` markers)."""
    gcp = "\n".join(f"* `{p}`" for p in GCP_HEAD_PERMISSIONS)
    return "\n".join(
        [
            f"#### GCP: the head's custom role `{GCP_HEAD_ROLE_ID}` (`GCP_HEAD_PERMISSIONS`)",
            "",
            gcp,
            "",
            "bound to the head's service account by the CLI for each run alone, with this IAM condition (title "
            f"`{GCP_BINDING_TITLE}RUN`; `gcp_head_condition(RUN)`, here for a run called `RUN` with the default "
            "`--worker-egress nat`; with `existing` or `public` the subnetwork clause also names "
            f"`/subnetworks/{GCP_NETWORK_SUBNETWORK}`):",
            "",
            "```",
            GCP_HEAD_CONDITION,
            "```",
            "",
            "#### GCP: you (the CLI)",
            "",
            "The head's permissions plus "
            + ", ".join(f"`{p}`" for p in GCP_CLI_PERMISSIONS if p not in GCP_HEAD_PERMISSIONS)
            + " (to start the head with its service account; to read its SSH host keys from its serial console before "
            "the first connection; to bind its role for the run and remove that binding when the run ends) and "
            "`iam.serviceAccounts.actAs` on that account.",
        ]
    )
