"""The GCP head's rights, run by run: the binding of its role that the CLI makes for one run, conditioned on that run's
resource names, evaluated as IAM evaluates conditions (tests/iam_conditions.py) against every resource the provider
really made in the GCE fake; the binding's life (made with the run, gone with it, swept when left); the dry run."""

from __future__ import annotations

import time

import pytest
from cloud_helpers import cloud_catalog
from gce_fake import GceFake, gce_fake  # noqa: F401  (fixture)
from iam_conditions import allows

from rubberband.cloud.failover import RetryPolicy
from rubberband.cloud.gcp.provider import GcpProvider
from rubberband.cloud.gcp.identity import GCP_HEAD_PERMISSIONS, GcpIdentities, gcp_head_condition
from rubberband.cloud.head_session import HeadOptions
from rubberband.cloud.registry import head_mode
from rubberband.cloud.provider import TAG_ROLE, InstanceRequest
from rubberband.errors import CloudError

V100 = cloud_catalog().find("n1-standard-8+V100x1", region="us-central1")
SA = "rb-head@rubberband-test.iam.gserviceaccount.com"
COMPUTE = "compute.googleapis.com"


def _provider(fake: GceFake, **kwargs) -> GcpProvider:
    kwargs.setdefault("retry", RetryPolicy(max_tries=3, sleep=lambda s: None))
    return GcpProvider("us-central1", endpoint=fake.url, poll_s=0.01, ssh_cidr="203.0.113.9/32", **kwargs)


def _made(fake: GceFake) -> dict[str, list[tuple[str, str]]]:
    """Every resource the fake holds, by the run its name belongs to ("" for the user's and the network's own), as
    (IAM resource type, full resource name)."""
    project = "projects/rubberband-test"
    found: list[tuple[str, str]] = [
        *((f"{COMPUTE}/Instance", f"{project}/zones/{z}/instances/{n}") for z, n in fake.instances),
        *((f"{COMPUTE}/Disk", f"{project}/zones/{z}/disks/{n}") for z, n in fake.disks),
        *((f"{COMPUTE}/Firewall", f"{project}/global/firewalls/{n}") for n in fake.firewalls),
        *((f"{COMPUTE}/Router", f"{project}/regions/{r}/routers/{n}") for r, n in fake.routers),
        *((f"{COMPUTE}/Subnetwork", f"{project}/regions/{r}/subnetworks/{n}") for r, n in fake._all_subnetworks()),
    ]
    by_run: dict[str, list[tuple[str, str]]] = {}
    for kind, name in found:
        leaf = name.rsplit("/", 1)[-1]
        run = next((r for r in ("run-a", "run-b", "run-ab") if leaf.startswith((f"rb-{r}-", f"rubberband-{r}-"))), "")
        by_run.setdefault(run, []).append((kind, name))
    return by_run


def _make_run(fake: GceFake, run_id: str) -> None:
    """What a run makes: its head, workers (with the subnetwork and NAT they need), firewall rules, boot disks."""
    p = _provider(fake)
    p.provision(InstanceRequest(run_id, 0, V100, extra_tags={TAG_ROLE: "head"}))
    p.provision(InstanceRequest(run_id, 1, V100, count=2))


def test_the_heads_binding_lets_it_touch_its_own_run_alone(gce_fake, monkeypatch):
    """The CLI binds the head's role to the service account for this run alone: evaluated as IAM does, its condition
    admits every VM, boot disk, firewall rule, router and subnetwork the provider made for the run, and none of
    another run's — not even one whose id begins like it (run-ab beside run-a) — nor the user's own look-alikes or
    the network's own subnetwork; what it does not name (the project a list call names, images, the network,
    operations) it leaves to the role."""
    monkeypatch.setenv("RUBBERBAND_GCE_ENDPOINT", gce_fake.url)
    gce_fake.add_service_account(SA, list(GCP_HEAD_PERMISSIONS))
    for run_id in ("run-a", "run-b", "run-ab"):
        _make_run(gce_fake, run_id)
    gce_fake.add_disk("us-central1-a", "rb-mine-0-abcdef")
    gce_fake.add_router("us-central1", "rubberband-mine-nat", description="the user's own")
    identity = head_mode("gcp").identity("run-a", "us-central1", HeadOptions(service_account=SA))
    assert identity.created and identity.name == SA
    (binding,) = gce_fake.iam_bindings
    assert binding["role"] == "projects/rubberband-test/roles/rubberbandHead"
    assert binding["members"] == [f"serviceAccount:{SA}"]
    assert binding["condition"]["title"] == "rubberband-run-run-a"
    condition = binding["condition"]["expression"]
    made = _made(gce_fake)
    assert {kind.rsplit("/", 1)[1] for kind, _ in made["run-a"]} == {
        "Instance",
        "Disk",
        "Firewall",
        "Router",
        "Subnetwork",
    }
    assert all(allows(condition, kind, name) for kind, name in made["run-a"])
    for other in ("run-b", "run-ab", ""):
        assert not any(allows(condition, kind, name) for kind, name in made[other]), other
    for kind, name in [
        ("cloudresourcemanager.googleapis.com/Project", "projects/rubberband-test"),
        (f"{COMPUTE}/Image", "projects/deeplearning-platform-release/global/images/x"),
        (f"{COMPUTE}/Network", "projects/rubberband-test/global/networks/default"),
    ]:
        assert allows(condition, kind, name)


def test_with_the_networks_egress_the_binding_also_names_the_networks_subnetwork():
    """--worker-egress existing|public: the workers go into the network's own subnetwork (``default``), which the
    head must then use; with ``nat`` it never may."""
    default = f"{COMPUTE}/Subnetwork", "projects/p/regions/us-central1/subnetworks/default"
    for egress, expect in (("nat", False), (None, False), ("existing", True), ("public", True)):
        assert allows(gcp_head_condition("run-a", worker_egress=egress), *default) is expect
    assert not allows(gcp_head_condition("run-a", worker_egress="public"), f"{COMPUTE}/Firewall", default[1])


def test_the_runs_binding_goes_with_the_run_and_the_sweep_finds_a_left_one(gce_fake, monkeypatch):
    """The binding is made read-modify-write on the project's policy (a write that raced another is made again;
    bindings of others are kept), made once however often it is asked for, removed by the run's end
    (delete_run_identity: end_run and down) and, left by a run whose head ended itself, by the sweep once the run has
    no VM left and the binding is older than the threshold."""
    from rubberband.commands.down import down_orphans

    monkeypatch.setenv("RUBBERBAND_GCE_ENDPOINT", gce_fake.url)
    gce_fake.add_service_account(SA, list(GCP_HEAD_PERMISSIONS))
    theirs = {"role": "roles/viewer", "members": ["user:someone@example.com"]}
    gce_fake.iam_bindings.append(theirs)
    identities = GcpIdentities(endpoint=gce_fake.url)
    gce_fake.iam_races = 2  # two writes find the policy changed in between: read again, write again
    identities.bind_run(SA, "run-a")
    identities.bind_run(SA, "run-a")  # a retried start: nothing more
    identities.bind_run(SA, "run-b")
    assert sorted(gce_fake.run_bindings()) == ["rubberband-run-run-a", "rubberband-run-run-b"]
    assert theirs in gce_fake.iam_bindings
    assert head_mode("gcp").delete_identity("run-a") == ["iam-binding/rubberband-run-run-a"]
    assert head_mode("gcp").delete_identity("run-a") == []
    assert sorted(gce_fake.run_bindings()) == ["rubberband-run-run-b"] and theirs in gce_fake.iam_bindings

    _make_run(gce_fake, "run-c")  # a live run keeps its binding
    identities.bind_run(SA, "run-c")
    assert identities.leftover_runs({"run-c"}, older_than_s=3600) == []  # run-b's is young
    assert down_orphans("gcp", ["us-central1"], 3600, now=time.time() + 7200) >= 0
    assert gce_fake.run_bindings() == {} and theirs in gce_fake.iam_bindings  # run-c: an orphan at +2 h too
    gce_fake.iam_races = 10
    with pytest.raises(CloudError):  # a policy that keeps changing: given up, one line
        identities.bind_run(SA, "run-d")


def test_binding_needs_the_clis_right_to_set_the_policy_and_the_role_and_account(gce_fake):
    """No role `rubberbandHead` in the project, or no such service account: IAM refuses the binding and the CLI says
    so in one line, before anything is started."""
    identities = GcpIdentities(endpoint=gce_fake.url)
    with pytest.raises(CloudError, match="rubberbandHead") as info:
        identities.bind_run(SA, "run-a")
    assert info.value.kind == "fatal" and "\n" not in str(info.value)
    gce_fake.roles["projects/rubberband-test/roles/rubberbandHead"] = list(GCP_HEAD_PERMISSIONS)
    with pytest.raises(CloudError, match="does not exist"):
        identities.bind_run(SA, "run-a")
    assert gce_fake.iam_bindings == []
    gce_fake.rejected.clear()


def test_a_cli_that_may_not_set_the_policy_says_so_and_the_sweep_goes_on(gce_fake, monkeypatch, capsys):
    """Without resourcemanager.projects.setIamPolicy the run cannot start: one line naming the permission. Without
    getIamPolicy the sweep still ends the dead run's VMs and resources and says what it could not sweep."""
    from rubberband.commands.down import down_orphans

    monkeypatch.setenv("RUBBERBAND_GCE_ENDPOINT", gce_fake.url)
    gce_fake.add_service_account(SA, list(GCP_HEAD_PERMISSIONS))
    gce_fake.iam_forbidden = {"setIamPolicy"}
    with pytest.raises(CloudError, match="resourcemanager.projects.setIamPolicy") as info:
        head_mode("gcp").identity("run-a", "us-central1", HeadOptions(service_account=SA))
    assert info.value.kind == "fatal" and "\n" not in str(info.value) and not gce_fake.iam_bindings
    _make_run(gce_fake, "run-a")
    gce_fake.iam_forbidden = {"getIamPolicy"}
    assert down_orphans("gcp", ["us-central1"], 3600, now=time.time() + 7200) == 3
    assert not gce_fake.instances and not gce_fake.firewalls and not gce_fake.subnetworks
    assert "could not sweep the head role's run bindings" in capsys.readouterr().out


def test_gcp_dry_run_reports_a_binding_broader_than_a_run(gce_fake):
    """The dry run checks the head's role grants every permission the head needs, and reports a binding of the
    account that is not a run's own (the one-time, project-wide binding earlier rubberbands asked for) as broader
    than rubberband needs (a 'deny' check found allowed: reported, not fatal)."""
    identities = GcpIdentities(endpoint=gce_fake.url)
    gce_fake.add_service_account(SA, list(GCP_HEAD_PERMISSIONS))
    checks = identities.check_service_account(SA)
    assert all(c.allowed for c in checks) and not [c for c in checks if c.expect == "deny"]
    identities.bind_run(SA, "run-a")  # a run's own binding is no finding
    assert not [c for c in identities.check_service_account(SA) if c.expect == "deny"]
    gce_fake.add_service_account(SA, list(GCP_HEAD_PERMISSIONS), bound=True)
    (broader,) = [c for c in identities.check_service_account(SA) if c.expect == "deny"]
    assert broader.allowed and broader.action == "projects/rubberband-test/roles/rubberbandHead"
    assert "unconditionally" in broader.detail and "broader than rubberband needs" in broader.detail
    gce_fake.roles.clear()
    denied = [c for c in identities.check_service_account(SA) if c.allowed is False]
    assert {c.action for c in denied} == set(GCP_HEAD_PERMISSIONS) and "no role" in denied[0].detail


def test_a_gcp_head_that_cannot_start_leaves_no_binding_behind(gce_fake, monkeypatch, tmp_path):
    """start_head binds the head's role for the run before the head starts; when the start fails (the head's type is
    sold out everywhere) the binding goes with everything else the start made."""
    from test_cloud_cli import Offer, cloud_job, cloud_plan

    from rubberband.cloud.head_session import HeadOptions, NewRun, start_head
    from rubberband.plan import load_plan

    monkeypatch.setenv("RUBBERBAND_GCE_ENDPOINT", gce_fake.url)
    gce_fake.add_service_account(SA, list(GCP_HEAD_PERMISSIONS))
    gce_fake.stockout_types = {"e2-standard-2"}
    plan = load_plan(cloud_plan(tmp_path, cloud_job(tmp_path, ["gcp"]), Offer("gcp", "us-central1", V100.name)))
    key = tmp_path / "key"
    key.write_text("not a key\n")
    with pytest.raises(CloudError, match="ZONE_RESOURCE_POOL_EXHAUSTED|sold out|capacity"):
        start_head(
            run=NewRun("gcp-fails", tmp_path / "run", metric="loss"),
            plan=plan,
            catalog=cloud_catalog(),
            options=HeadOptions(ssh_cidr="203.0.113.9/32", ssh_key=key, service_account=SA),
            boots=None,
        )
    assert any(r.endswith(":setIamPolicy") for r in gce_fake.requests)  # it was bound, then unbound
    assert gce_fake.run_bindings() == {} and not gce_fake.instances
    assert not gce_fake.firewalls and not gce_fake.routers and not gce_fake.subnetworks
