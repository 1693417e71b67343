"""Head mode: `rubberband run --cloud aws|gcp` starts a head instance per run, submits the run to its Ray job
server, streams progress, fetches the run directory and ends the head — against the moto server / the GCE fake,
with the head's and workers' boots played by local Ray nodes (the CLI run through tests/cli_harness.py with
``--test-boot local``).

The whole runs are slow (35-50 s each on the shared 2-core machine): the played head's Ray, the job's start and
each worker's Ray node come one after another; one run per cloud, and the AWS one also covers detach / attach."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
import shutil
import shlex
import signal
import subprocess
import time
from pathlib import Path

import boto3
import pytest
from cli_harness import played_argv
from cloud_helpers import (
    FAKE_ACCESS_KEY,
    FAKE_SECRET_KEY,
    GCP_CATALOG_CSV,
    REGION,  # noqa: F401  (fixtures)
    assert_fetched_run,
    assert_played_head_gone,
    ec2_faults,  # noqa: F401
    moto_env,  # noqa: F401
    moto_server,  # noqa: F401
    no_played_head_left,  # noqa: F401
)
from gce_fake import gce_fake  # noqa: F401
from test_cloud_cli import Offer, cloud_env, cloud_job, cloud_plan, moto_instances, one_error_line, small_gcp_job

from rubberband.catalog import parse_catalog
from rubberband.catalog import head_types
from rubberband.cloud.head_run import unpack
from played_boots import PlayedBoots

from rubberband.head_job import build_parser, pack
from rubberband.cloud.head_link import DirectLink
from rubberband.cloud.head_session import (
    HeadOptions,
    HeadRecord,
    HeadSession,
    NewRun,
    RunJob,
    end_run,
    entrypoint,
    link_for,
    stage_code,
    start_head,
)
from rubberband.errors import CloudError, InputError
from rubberband.executor import journal as J
from rubberband.plan import load_plan
from rubberband.spec import load_spec

from conftest import REPO


HEAD_SA = "rb-head@rubberband-test.iam.gserviceaccount.com"


def small_job(tmp_path: Path, epoch_s: float = 0.2):
    spec = cloud_job(tmp_path, ["aws"], trials=3, eta=3, min_epochs=1, max_epochs=3, epoch_s=epoch_s)
    plan = cloud_plan(tmp_path, spec, Offer("aws", REGION, "p3.2xlarge"), counts=(1, 1), durations=(20.0, 20.0))
    return spec, plan


def assert_nothing_left(head_id: str) -> None:
    """No instance in moto, no security group, no IAM role or instance profile, no played head (Ray processes,
    disk)."""
    assert_nothing_left_but_the_group(head_id)
    groups = boto3.client("ec2", region_name=REGION).describe_security_groups()["SecurityGroups"]
    assert [g["GroupName"] for g in groups if g["GroupName"] != "default"] == []
    iam = boto3.client("iam")
    assert iam.list_roles()["Roles"] == [] and iam.list_instance_profiles()["InstanceProfiles"] == []


def moto_groups() -> list[dict]:
    return boto3.client("ec2", region_name=REGION).describe_security_groups()["SecurityGroups"]


def assert_nothing_left_but_the_group(head_id: str) -> None:
    """No instance in moto, no played head (Ray processes, disk). (A head whose run ends otherwise than by its own
    watchdog leaves its AWS security group and role to the CLI: `end_run`, `down` or the orphan sweep; they cost
    nothing.)"""
    assert_played_head_gone(head_id)
    assert moto_instances() == []


def test_run_streams_ctrl_c_detaches_attach_fetches_and_leaves_nothing(cli, tmp_path, moto_env):
    """`run --cloud aws` starts an m6i.large head tagged role=head, submits the run as a Ray job and streams it;
    Ctrl-C detaches (the run goes on); `--attach` streams to the end, fetches the run directory (report works
    locally) and ends the head. No credential reaches the job, the head's user-data or the journal.

    2-second epochs: the run is still going when Ctrl-C comes, even on a loaded machine (with 0.2-second ones it
    could end first)."""
    spec, plan = small_job(tmp_path, epoch_s=2.0)
    env = cloud_env(tmp_path, moto_env)
    run_dir = tmp_path / "run"
    log = tmp_path / "cli.err"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            played_argv("run", spec, "--cloud", "aws", "--plan", plan, "--yes", "--run-dir", run_dir),
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    record = None
    try:
        deadline = time.monotonic() + 240  # generous: the shared test machine can be very busy
        while "stage 0 (1 of 2" not in log.read_text():  # the executor's progress, streamed from the head
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        record = HeadRecord.read(run_dir)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
        detached = log.read_text()
        assert "detached" in detached and f"--attach {run_dir} --cloud aws" in detached
        assert f"down {run_dir} --cloud aws" in detached
        (head,) = [i for i in moto_instances() if i["InstanceType"] == "m6i.large"]  # the run goes on
        tags = {t["Key"]: t["Value"] for t in head["Tags"]}
        assert head["InstanceId"] == record.instance_id
        assert tags["rubberband-role"] == "head" and tags["rubberband-run-id"] == record.cloud_run_id
        # the head acts with the instance profile made for the run (least privilege: docs/clouds.md); no worker has
        # an identity
        assert record.identity == f"rb-{record.cloud_run_id}" and record.identity_created
        assert head["IamInstanceProfile"]["Arn"].endswith(f"instance-profile/rubberband/{record.identity}")
        assert all("IamInstanceProfile" not in i for i in moto_instances() if i["InstanceId"] != head["InstanceId"])
        from rubberband.cloud.aws.identity import AwsIdentities, aws_head_policy

        assert boto3.client("iam").get_role_policy(RoleName=record.identity, PolicyName="rubberband-head")[
            "PolicyDocument"
        ] == aws_head_policy(
            record.cloud_run_id, account="123456789012", parking_group=AwsIdentities().parking_group(record.region)
        )
        # the job as the head's job server holds it: entrypoint and runtime_env, and the head's user-data
        from ray.job_submission import JobSubmissionClient

        from played_boots import head_url

        # the head's Ray runs with the run's token (RUN_DIR/ray-token, the user's alone): no token, no answer
        token = (run_dir / "ray-token").read_text()
        assert len(token) == 64 and (run_dir / "ray-token").stat().st_mode & 0o077 == 0
        with pytest.raises(Exception, match="401|403|[Aa]uthentication"):
            JobSubmissionClient(head_url(record.instance_id)).list_jobs()
        authorized = {"Authorization": f"Bearer {token}"}
        info = JobSubmissionClient(head_url(record.instance_id), headers=authorized).get_job_info(record.cloud_run_id)
        assert "head_job_harness.py run" in info.entrypoint and record.instance_id in info.entrypoint
        assert info.runtime_env["working_dir"].startswith("gcs://")  # the code directory, packed by Ray Jobs
        # rubberband itself ships with every job: this checkout's package (the head's boot installed none)
        (package,) = info.runtime_env["py_modules"]
        assert package.startswith("gcs://_ray_pkg_")
        watchdog = JobSubmissionClient(head_url(record.instance_id), headers=authorized).get_job_info(
            f"{record.cloud_run_id}-watchdog"
        )
        assert (
            "rubberband.cloud.watchdog_cli watchdog" in watchdog.entrypoint
            and "--poweroff-marker" in watchdog.entrypoint
        )
        assert watchdog.runtime_env["py_modules"] == [package] and watchdog.status == "RUNNING"
        user_data = boto3.client("ec2", region_name=REGION).describe_instance_attribute(
            InstanceId=record.instance_id, Attribute="userData"
        )["UserData"]["Value"]
        for text in (info.entrypoint, json.dumps(info.runtime_env), user_data):
            assert FAKE_ACCESS_KEY not in text and FAKE_SECRET_KEY not in text and token not in text
        workers_data = [
            base64.b64decode(
                boto3.client("ec2", region_name=REGION).describe_instance_attribute(
                    InstanceId=i["InstanceId"], Attribute="userData"
                )["UserData"]["Value"]
            ).decode()
            # every worker the run started, a released one too (on a busy machine stage 0 may be over by now)
            for i in moto_instances(states=("pending", "running", "stopping", "stopped", "shutting-down", "terminated"))
            if i["InstanceId"] != record.instance_id
        ]
        assert workers_data and all("RAY_AUTH_MODE=token" in d and token not in d for d in workers_data)
        assert "RAY_AUTH_MODE=token" in base64.b64decode(user_data).decode()

        attached = cli("run", "--attach", run_dir, env=env, timeout=120, test_boot="local")
    finally:
        if proc.poll() is None:
            proc.kill()
        if record is not None:
            end_run(record, boots=PlayedBoots())
    assert attached.returncode == 0, attached.stderr[-3000:]
    assert "stage 1 (2 of 2" in attached.stderr and "BEGIN RUBBERBAND" not in attached.stderr
    assert "finished: best trial" in attached.stdout and str(run_dir / "result.json") in attached.stdout
    summary = assert_fetched_run(cli, run_dir, tmp_path / "report.html", env)
    # the deadline and the JCT count from the command: the head's executor worked to what the head's boot and the
    # upload had left of it (they went before its start, measured from the command)
    planned, actual = json.loads(Path(plan).read_text())["deadline_s"], summary["actual"]
    before = actual["before_start_s"]
    assert before > 0 and summary["deadline_s"] == planned
    assert J.read_state(run_dir).deadline_s == pytest.approx(planned - before, abs=0.05)
    assert actual["jct_s"] == pytest.approx(actual["jct_from_start_s"] + before)
    # the head bills itself: from its launch until the results grace (10m by default) after the run's end
    head = summary["head"]
    assert head["id"] == record.instance_id and head["instance_type"] == "m6i.large" and head["grace_s"] == 600
    assert head["lifetime_s"] > 600
    assert head["cost_usd"] == pytest.approx(head["billed_s"] * head_types()["aws"].price_hr / 3600)
    workers = sum(i["cost_usd"] for i in summary["instances"])
    assert summary["actual"]["head_usd"] == head["cost_usd"]
    assert summary["actual"]["cost_usd"] == pytest.approx(workers + head["cost_usd"])
    journal = (run_dir / "journal.jsonl").read_text()
    assert FAKE_ACCESS_KEY not in journal and FAKE_SECRET_KEY not in journal
    for path in run_dir.rglob("*"):  # the token is in its own file only: not in a log, journal or fetched file
        if path.is_file() and path.name != "ray-token":
            assert token not in path.read_text(errors="replace"), path
    assert token not in attached.stdout + attached.stderr + log.read_text()
    assert not (run_dir / "ray-token").exists()  # forgotten once the cluster was gone
    requested = [json.loads(line) for line in journal.splitlines() if '"instance_requested"' in line]
    assert requested and all(r["instance_type"] == "p3.2xlarge" for r in requested)
    assert_nothing_left(record.instance_id)


def test_detached_run_ends_itself_with_nothing_left(cli, tmp_path, moto_env):
    """`--detach` returns once the run is submitted; with nobody attached (the laptop closed) the run finishes on the
    head, and its watchdog ends the head and every worker after the results grace."""
    spec = cloud_job(tmp_path, ["aws"], trials=2, eta=3, min_epochs=1, max_epochs=1, epoch_s=0.2)
    plan = cloud_plan(tmp_path, spec, Offer("aws", REGION, "p3.2xlarge"), counts=(1,), durations=(20.0,))
    env = cloud_env(tmp_path, moto_env)
    run_dir = tmp_path / "run"
    submitted = cli(
        "run",
        spec,
        "--cloud",
        "aws",
        "--plan",
        plan,
        "--yes",
        "--run-dir",
        run_dir,
        "--detach",
        "--results-grace",
        "1s",
        env=env,
        timeout=120,
        test_boot="local",
    )
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    assert "submitted run" in submitted.stderr and f"--attach {run_dir}" in submitted.stderr
    record = HeadRecord.read(run_dir)
    try:
        deadline = time.monotonic() + 240  # the run, then the watchdog's 1 s grace (generous: a busy machine)
        while moto_instances():
            assert time.monotonic() < deadline, moto_instances()
            time.sleep(0.5)
        assert_nothing_left_but_the_group(record.instance_id)
        # the head left its security group and deleted it, then ended its instance profile and its role's policy
        # and powered off (issue 29); the empty role, which no role can delete itself, is left to `down RUN_DIR`,
        # which finds the run by its head.json and the role by its tag
        assert [g["GroupName"] for g in moto_groups() if g["GroupName"] != "default"] == []
        iam = boto3.client("iam")
        assert iam.list_instance_profiles()["InstanceProfiles"] == []
        assert iam.list_role_policies(RoleName=f"rb-{record.cloud_run_id}")["PolicyNames"] == []
        down = cli("down", run_dir, "--cloud", "aws", env=env)
        assert down.returncode == 0, down.stderr
        assert "deleted aws sg-" not in down.stdout
        assert f"deleted aws role/rb-{record.cloud_run_id}" in down.stdout  # the head's role, found by its tag
        assert_nothing_left(record.instance_id)
        late = cli("run", "--attach", run_dir, env=env, timeout=60, test_boot="local")  # too late: says so at once
        assert late.returncode == 1 and "is gone" in late.stderr
    finally:
        end_run(record, boots=PlayedBoots())
    assert not (run_dir / "result.json").exists()  # nothing was fetched: the run went on without the CLI


def test_head_mode_needs_ssh_settings_outside_tests(cli, tmp_path, moto_env):
    spec, plan = small_job(tmp_path)
    env = cloud_env(tmp_path, moto_env)
    result = cli("run", spec, "--cloud", "aws", "--plan", plan, "--yes", "--run-dir", tmp_path / "run", env=env)
    assert result.returncode == 2, result.stderr
    assert "--ssh-cidr" in one_error_line(result) and "--head local" in one_error_line(result)
    assert moto_instances() == []
    bad = cli("run", spec, "--cloud", "aws", "--plan", plan, "--yes", "--head", "laptop", env=env)
    assert bad.returncode == 2 and "--head" in one_error_line(bad)
    local_detach = cli("run", spec, "--cloud", "aws", "--head", "local", "--plan", plan, "--yes", "--detach", env=env)
    assert local_detach.returncode == 2 and "--detach" in one_error_line(local_detach)
    key = tmp_path / "key"
    key.write_text("k\n")
    ipv6 = cli(
        "run",
        spec,
        "--cloud",
        "aws",
        "--plan",
        plan,
        "--yes",
        "--ssh-cidr",
        "2001:db8::7/128",
        "--ssh-key",
        key,
        "--key-name",
        "rb",
        "--run-dir",
        tmp_path / "run6",
        env=env,
    )
    assert ipv6.returncode == 2 and "IPv6" in one_error_line(ipv6) and "Traceback" not in ipv6.stderr
    assert moto_instances() == [] and not (tmp_path / "run6" / "head.json").exists()


def test_gcp_run_on_a_head_instance_streams_fetches_and_leaves_nothing(cli, tmp_path, gce_fake, monkeypatch):
    """`run --cloud gcp` against the GCE fake: an e2-standard-2 head labelled role=head runs the executor (its boot
    played by a local Ray head), n1-standard-8+V100x1 workers join it; the CLI streams the run to its end, fetches
    the run directory (report works locally) and deletes the head, every worker, the run's firewall rules and the
    Cloud NAT its private workers went out through (the default)."""
    from rubberband.cloud.gcp.names import owner_marker, router_name, subnet_name

    monkeypatch.setenv("RUBBERBAND_GCE_ENDPOINT", gce_fake.url)  # for end_run below, should the run fail
    spec, plan, env = small_gcp_job(tmp_path, gce_fake)
    run_dir = tmp_path / "run"
    routers_at_insert: dict[str, list] = {}  # VM name -> the routers there when it was inserted
    insert = gce_fake._insert

    def watched_insert(**kwargs):
        routers_at_insert[kwargs["body"].get("name", "")] = [dict(r) for r in gce_fake.routers.values()]
        return insert(**kwargs)

    monkeypatch.setattr(gce_fake, "_insert", watched_insert)
    try:
        result = cli(
            "run",
            spec,
            "--cloud",
            "gcp",
            "--plan",
            plan,
            "--yes",
            "--run-dir",
            run_dir,
            env=env,
            timeout=400,
            test_boot="local",
        )
    finally:
        if (run_dir / "head.json").exists():
            end_run(HeadRecord.read(run_dir), boots=PlayedBoots())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stage 1 (2 of 2" in result.stderr and "finished: best trial" in result.stdout  # streamed from the head
    record = HeadRecord.read(run_dir)
    inserted = {body["name"]: body for body in gce_fake.inserted()}
    head = inserted.pop(record.instance_id)
    assert head["machineType"].endswith("/e2-standard-2") and head["labels"]["rubberband-role"] == "head"
    assert head["labels"]["rubberband-run-id"] == record.cloud_run_id
    # the head acts with the service account named (RUBBERBAND_SERVICE_ACCOUNT), the workers with none
    assert [a["email"] for a in head["serviceAccounts"]] == [env["RUBBERBAND_SERVICE_ACCOUNT"]]
    # its role bound for this run alone, and the binding gone with the run
    assert record.identity == env["RUBBERBAND_SERVICE_ACCOUNT"] and record.identity_created
    assert any(r.endswith(":setIamPolicy") for r in gce_fake.requests) and gce_fake.run_bindings() == {}
    assert all("serviceAccounts" not in b for b in inserted.values())
    # the run's token (64 hex digits) is in no VM's metadata: the head has it over SSH, the workers from the head;
    # the CLI forgot its own copy once the cluster was gone
    assert not (run_dir / "ray-token").exists()
    hex64 = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
    for body in (head, *inserted.values()):
        script = next(i["value"] for i in body["metadata"]["items"] if i["key"] == "startup-script")
        assert "RAY_AUTH_MODE=token" in script and not hex64.search(json.dumps(body))
    assert inserted and {b["machineType"].rsplit("/", 1)[-1] for b in inserted.values()} == {"n1-standard-8"}
    assert all(b["labels"]["rubberband-role"] == "worker" for b in inserted.values())
    # only the head has an external address (its SSH); the workers none: they go into the run's own subnetwork and
    # out through the run's own Cloud NAT of that subnetwork alone, made by the CLI before the head (and marked as the
    # run's), there at every worker's insert
    assert head["networkInterfaces"][0]["accessConfigs"]
    assert all(not b["networkInterfaces"][0].get("accessConfigs") for b in inserted.values())
    subnet = f"regions/us-central1/subnetworks/{subnet_name(record.cloud_run_id)}"
    assert all(b["networkInterfaces"][0]["subnetwork"] == subnet for b in inserted.values())
    for name in (record.instance_id, *inserted):
        (router,) = routers_at_insert[name]
        assert router["name"] == router_name(record.cloud_run_id)
        assert router["description"].endswith(owner_marker(record.cloud_run_id))
        assert router["nats"][0]["sourceSubnetworkIpRangesToNat"] == "LIST_OF_SUBNETWORKS"
        assert [n["name"].endswith(subnet) for n in router["nats"][0]["subnetworks"]] == [True]
    assert record.worker_egress == "nat"
    assert_fetched_run(cli, run_dir, tmp_path / "report.html", env)
    requested = [e for e in J.iter_events(run_dir / J.JOURNAL_NAME) if e["type"] == J.INSTANCE_REQUESTED]
    assert {e["id"] for e in requested} == set(inserted)  # the head's executor provisioned the workers
    assert all(e["instance_type"] == "n1-standard-8+V100x1" and e["cloud"] == "gcp" for e in requested)
    assert not gce_fake.instances and not gce_fake.firewalls and not gce_fake.routers and not gce_fake.subnetworks
    assert_played_head_gone(record.instance_id)


# -- unit level --------------------------------------------------------------------------------------------------


def test_pack_and_unpack_round_trip_without_checkpoints(tmp_path):
    run_dir = tmp_path / "head-run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "t1.pt").write_bytes(b"x" * 1000)
    (run_dir / "journal.jsonl").write_text('{"type": "run_started"}\n')
    (run_dir / "result.json").write_text("{}")
    logs = f"some log line\n{_wrap(pack(run_dir))}\nanother line\n"
    names = unpack(logs, tmp_path / "local")
    assert sorted(names) == ["journal.jsonl", "result.json"]
    assert (tmp_path / "local" / "journal.jsonl").read_text() == '{"type": "run_started"}\n'
    assert not (tmp_path / "local" / "checkpoints").exists()
    # streamed in pieces cut anywhere: the pack is kept, not shown
    from rubberband.cloud.head_run import LogFilter

    log_filter, shown = LogFilter(), ""
    for i in range(0, len(logs), 7):
        shown += log_filter.feed(logs[i : i + 7])
    assert shown == "some log line\nanother line\n" and log_filter.packed is not None
    assert sorted(unpack(log_filter.packed, tmp_path / "again")) == ["journal.jsonl", "result.json"]


def test_pack_brings_back_the_best_trials_newest_checkpoint_only(tmp_path):
    import json

    from rubberband import head_job
    from rubberband.executor.checkpoints import save_checkpoint

    run_dir = tmp_path / "head-run"
    for trial_id in ("b0-t000", "b0-t001"):
        for epoch in (0, 1):
            save_checkpoint(run_dir / "checkpoints" / trial_id, epoch, {"w": [epoch]}, trial_id=trial_id)
    head_path = run_dir / "checkpoints" / "b0-t001" / "epoch-1.pt"
    (run_dir / "result.json").write_text(json.dumps({"best": {"trial_id": "b0-t001", "checkpoint": str(head_path)}}))
    local = tmp_path / "local"
    names = unpack(_wrap(pack(run_dir)), local)
    assert sorted(names) == ["checkpoints/b0-t001/epoch-1.pt", "checkpoints/b0-t001/latest", "result.json"]
    best = json.loads((local / "result.json").read_text())["best"]
    assert best["checkpoint"] == str((local / "checkpoints" / "b0-t001" / "epoch-1.pt").resolve())
    # a checkpoint too large for the log channel stays on the head (and result.json keeps naming it there)
    small = head_job.MAX_FETCHED_CHECKPOINT_BYTES
    try:
        head_job.MAX_FETCHED_CHECKPOINT_BYTES = 10
        names = unpack(_wrap(pack(run_dir)), tmp_path / "again")
    finally:
        head_job.MAX_FETCHED_CHECKPOINT_BYTES = small
    assert names == ["result.json"]
    assert json.loads((tmp_path / "again" / "result.json").read_text())["best"]["checkpoint"] == str(head_path)


def _wrap(data: str) -> str:
    from rubberband.cloud.head_run import PACK_BEGIN, PACK_END

    return "\n".join([PACK_BEGIN, *(data[i : i + 76] for i in range(0, len(data), 76)), PACK_END])


def test_stage_code_ships_code_spec_plan_and_profile(tmp_path):
    spec = load_spec(REPO / "examples" / "digits.yaml")
    plan = _digits_plan(spec)
    work = stage_code(spec, plan, tmp_path)
    assert (work / "digits.py").exists() and (work / "_rubberband" / "spec.json").exists()
    assert (work / "_rubberband" / "plan.json").exists() and (work / "_rubberband" / "profile.json").exists()
    shipped = json.loads((work / "_rubberband" / "spec.json").read_text())
    assert "base_dir" not in shipped and shipped["train"] == "digits:train"
    assert not any(p.name == "__pycache__" for p in work.rglob("*"))


def _digits_plan(spec):
    from executor_helpers import make_plan

    from rubberband.planner.schedule import stages_for

    n = len(
        stages_for(
            spec.scheduler.kind,
            trials=spec.scheduler.trials,
            eta=spec.scheduler.eta,
            min_epochs=spec.scheduler.min_epochs,
            max_epochs=spec.scheduler.max_epochs,
        )
    )
    return make_plan(spec, [("local.cpu1", 1, 1)] * n, durations=[10.0] * n)


@pytest.mark.e2e  # runs `ssh -G`
def test_entrypoint_and_ssh_tunnel_commands(tmp_path):
    record = HeadRecord(
        run_id="My_Run-1",
        cloud="aws",
        region=REGION,
        instance_id="i-0abc",
        zone="us-east-1b",
        address="10.0.0.5",
        public_address="203.0.113.9",
        regions=[REGION],
        metric="loss",
    )
    words = entrypoint(
        record, RunJob(deadline_s=600, trial_runtime="rubberband.executor.trials", head_grace_s=300, overrun_s=60)
    ).split()
    assert words[:4] == ["python", "-m", "rubberband.head_job", "run"]
    assert "--head-id" in words and "i-0abc" in words and "--deadline" in words
    assert words[words.index("--head-grace") + 1] == "300" and words[words.index("--overrun-s") + 1] == "60"
    assert build_parser().parse_args(words[3:]).head_grace == 300.0
    assert build_parser().parse_args(words[3:] + ["--overrun-s", "inf"]).overrun_s == math.inf
    assert build_parser().parse_args(words[3:]).on_late == "finish"  # the default is left off the command line
    assert build_parser().parse_args(words[3:]).worker_egress == "nat"  # the default: the run's own Cloud NAT
    for egress in ("existing", "public"):  # what the CLI was asked for reaches the head's executor (GCP)
        gcp = dataclasses.replace(record, cloud="gcp", worker_egress=egress)
        assert (
            build_parser()
            .parse_args(entrypoint(gcp, RunJob(deadline_s=600, trial_runtime="x")).split()[3:])
            .worker_egress
            == egress
        )
    from rubberband.cloud.gcp import WORKER_EGRESS

    assert (
        build_parser()._subparsers._group_actions[0].choices["run"]._option_string_actions["--worker-egress"].choices
        == WORKER_EGRESS
    )
    stop = entrypoint(
        record, RunJob(deadline_s=600, trial_runtime="rubberband.executor.trials", on_late="stop")
    ).split()
    assert stop[stop.index("--on-late") + 1] == "stop" and build_parser().parse_args(stop[3:]).on_late == "stop"
    # a played head's run job is the suite's harness, which passes its player in (never a flag, never the
    # environment); a real one is rubberband's own
    assert words[:3] == ["python", "-m", "rubberband.head_job"] and "--test-boot" not in words
    played = entrypoint(record, RunJob(deadline_s=600, trial_runtime="x", boots=PlayedBoots())).split()
    assert played[1].endswith("head_job_harness.py") and build_parser().parse_args(played[2:]).run_id
    # so does a test's metadata server (spot notices) and trial runtime; a real one none
    assert "--metadata-url" not in words and build_parser().parse_args(words[3:]).metadata_url is None
    noticed = shlex.split(
        entrypoint(
            record,
            RunJob(
                deadline_s=600,
                trial_runtime="tests.stand_in",
                metadata_url="http://127.0.0.1:8/{instance}/",
            ),
        )
    )  # as the job's shell does
    assert (
        vars(build_parser().parse_args(noticed[3:])).items()
        >= {"metadata_url": "http://127.0.0.1:8/{instance}/", "trial_runtime": "tests.stand_in"}.items()
    )
    with pytest.raises(SystemExit):  # malformed: argparse's usage error
        build_parser().parse_args(words[3:] + ["--metadata-url", "169.254.169.254"])
    tunnel = link_for(record, None, Path("/k/id_ed25519"), tmp_path / "run")
    command = tunnel.command(40001)
    assert command[:4] == ["ssh", "-N", "-L", "40001:127.0.0.1:8265"] and command[-1].endswith("@203.0.113.9")
    # the run's own known_hosts, checked strictly after the first connection; never the user's
    assert f"UserKnownHostsFile={tmp_path / 'run' / 'known_hosts'}" in command
    assert "GlobalKnownHostsFile=/dev/null" in command and "StrictHostKeyChecking=accept-new" in command
    if shutil.which("ssh"):  # ssh itself accepts these options (-G prints the configuration it would use)
        shown = subprocess.run([*command[:1], "-G", *command[4:]], capture_output=True, text=True, timeout=30)
        assert shown.returncode == 0, shown.stderr
        assert f"userknownhostsfile {tmp_path / 'run' / 'known_hosts'}" in shown.stdout
        assert "stricthostkeychecking accept-new" in shown.stdout
    assert DirectLink("http://127.0.0.1:1").open(1.0) == "http://127.0.0.1:1"


def test_the_image_the_user_chose_boots_the_workers_the_head_starts(tmp_path, moto_env, monkeypatch):
    """Issue 29: RUBBERBAND_AWS_AMI / RUBBERBAND_GCP_IMAGE were read on the CLI machine only, so the head booted the
    chosen image and its executor, which sees none of the CLI's environment, booted the workers on the default one.
    Now the CLI records the choice in head.json and puts it on the run job's command line (--image), and the head's
    providers boot the workers on it: shown on moto with the variable gone from the head's side."""
    from cloud_helpers import cloud_catalog

    from rubberband.cloud.provider import InstanceRequest
    from rubberband.cloud.registry import ProviderPool
    from rubberband.head_job import provider_options

    chosen = "ami-0123456789abcdef0"
    monkeypatch.setenv("RUBBERBAND_AWS_AMI", chosen)
    plan = load_plan(cloud_plan(tmp_path, cloud_job(tmp_path, ["aws"]), Offer("aws", REGION, "p3.2xlarge")))
    key = tmp_path / "key"
    key.write_text("not a key\n")
    run_dir = tmp_path / "run"
    record = start_head(
        run=NewRun("image-run", run_dir, metric="loss"),
        plan=plan,
        catalog=cloud_catalog(),
        options=HeadOptions(ssh_cidr="203.0.113.9/32", ssh_key=key, key_name="rb"),
        boots=None,
    )
    try:
        assert record.image == chosen and HeadRecord.read(run_dir).image == chosen
        args = build_parser().parse_args(shlex.split(entrypoint(record, RunJob(deadline_s=600, trial_runtime="x")))[3:])
        assert args.image == chosen
        monkeypatch.delenv("RUBBERBAND_AWS_AMI")  # the head's jobs do not see the CLI's environment
        worker_type = cloud_catalog().find("p3.2xlarge", region=REGION)
        (worker,) = ProviderPool(provider_options(args))("aws", REGION).provision(
            InstanceRequest(record.cloud_run_id, 1, worker_type, zone=worker_type.zones[0])
        )
        images = {i["InstanceId"]: i["ImageId"] for i in moto_instances()}
        assert images == {record.instance_id: chosen, worker.id: chosen}
    finally:
        end_run(record, boots=None)
    # without a choice nothing goes on the command line: the head's provider keeps its own default
    plain = dataclasses.replace(record, image=None)
    assert "--image" not in entrypoint(plain, RunJob(deadline_s=600, trial_runtime="x"))
    gcp = build_parser().parse_args(
        entrypoint(
            dataclasses.replace(plain, cloud="gcp", image="projects/p/global/images/family/f"), RunJob(600, "x")
        ).split()[3:]
    )
    assert provider_options(gcp)["gcp"] == {"worker_egress": "nat", "image": "projects/p/global/images/family/f"}


def test_gcp_head_starts_in_the_workers_zone_and_ends_with_its_firewall(tmp_path, gce_fake, monkeypatch):
    """The head path on GCP against the GCE fake: an e2-standard-2 head labelled role=head in the zone of the
    first stage, its role bound for the run alone, recorded in head.json; end_run deletes it, the run's firewall
    rules and the binding."""
    from rubberband.cloud.gcp.identity import GCP_HEAD_PERMISSIONS

    monkeypatch.setenv("RUBBERBAND_GCE_ENDPOINT", gce_fake.url)
    gce_fake.add_service_account(HEAD_SA, list(GCP_HEAD_PERMISSIONS))
    load_spec(cloud_job(tmp_path, ["gcp"], trials=3, eta=3, min_epochs=1, max_epochs=3))
    plan = load_plan(
        cloud_plan(
            tmp_path, tmp_path / "job" / "job.yaml", Offer("gcp", "us-central1", "n1-standard-8+V100x1"), counts=(1, 1)
        )
    )
    catalog = parse_catalog("gcp", GCP_CATALOG_CSV)
    run_dir = tmp_path / "run"
    key = tmp_path / "id_ed25519"
    key.write_text("not a real key\n")
    record = start_head(
        run=NewRun("gcp-head-run", run_dir, metric="loss"),
        plan=plan,
        catalog=catalog,
        options=HeadOptions(ssh_cidr="203.0.113.9/32", ssh_key=key, service_account=HEAD_SA),
        boots=None,
    )
    try:
        assert HeadRecord.read(run_dir) == record
        assert {m for _, m in gce_fake.inserts} == {"e2-standard-2"}
        (vm,) = gce_fake.instances.values()
        assert vm["labels"]["rubberband-role"] == "head" and vm["labels"]["rubberband-run-id"] == "gcp-head-run"
        assert vm["serviceAccounts"] == [
            {"email": HEAD_SA, "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
        ]
        assert record.zone in ("us-central1-a", "us-central1-b")
        script = next(m["value"] for m in vm["metadata"]["items"] if m["key"] == "startup-script")
        assert "--dashboard-port=8265" in script and "rubberband==" not in script  # rubberband comes with the jobs
        assert "install-nvidia-driver" not in {m["key"] for m in vm["metadata"]["items"]}  # a CPU head
        assert "RUBBERBAND_RUN_ROOT" in script
        assert list(gce_fake.run_bindings()) == ["rubberband-run-gcp-head-run"] and record.identity_created
    finally:
        assert end_run(record, boots=None) == 1
    assert not gce_fake.instances and not gce_fake.firewalls and gce_fake.run_bindings() == {}


class _FlakyJobServer:
    """A job client whose log stream breaks: each connection replays the log from its start (as Ray's does)."""

    def __init__(self, log: str, breaks: list[int], status_fails: int = 0) -> None:
        self.log, self.breaks, self.status_fails, self.connections = log, list(breaks), status_fails, 0

    async def tail_job_logs(self, job_id):
        self.connections += 1
        cut = self.breaks.pop(0) if self.breaks else None
        for i in range(0, len(self.log) if cut is None else cut, 5):
            yield self.log[i : min(i + 5, len(self.log) if cut is None else cut)]
        if cut is not None:
            raise RuntimeError("WebSocket closed with close code 1006")

    def get_job_status(self, job_id):
        if self.status_fails:
            self.status_fails -= 1
            raise ConnectionError("connection refused")
        return type("Status", (), {"value": "SUCCEEDED" if not self.breaks else "RUNNING"})()


def _session(client) -> HeadSession:
    record = HeadRecord(
        run_id="r1",
        cloud="aws",
        region=REGION,
        instance_id="i-0abc",
        zone="us-east-1b",
        address="10.0.0.5",
        public_address=None,
        regions=[REGION],
        metric="loss",
    )
    session = HeadSession(record, DirectLink("http://127.0.0.1:1"))
    session.client = client
    return session


def test_a_dropped_log_stream_reconnects_and_shows_each_line_once():
    log = "".join(f"stage {i} line\n" for i in range(12))
    server = _FlakyJobServer(log, breaks=[23, 23, 101], status_fails=1)
    shown: list[str] = []
    assert _session(server).stream(shown.append, poll_s=0.01) == "SUCCEEDED"
    notices = [s for s in shown if s.startswith("(log stream interrupted")]
    assert len(notices) == 4  # three drops mid-log, one failed status call
    assert server.connections == 5  # the last one replays what was shown: skipped
    assert "".join(s for s in shown if s not in notices) == log


def test_a_link_broken_for_longer_than_the_grace_gives_up_saying_how_to_follow_again():
    server = _FlakyJobServer("x\n", breaks=[0] * 1000, status_fails=1000)
    shown: list[str] = []
    with pytest.raises(CloudError, match="lost the link to head i-0abc .* --attach"):
        _session(server).stream(shown.append, poll_s=0.01, link_grace_s=0.2)
    assert server.connections > 3 and len(shown) == 1  # retried quietly: one notice for the whole outage


def test_worker_egress_is_checked_before_anything_starts_and_old_head_records_still_read(tmp_path):
    """--worker-egress is GCP's (one line, exit 2, elsewhere or with a value it does not know); a head.json written
    when private workers were a flag reads as the egress it meant then."""
    from rubberband.cloud.head_session import HeadOptions, check_options

    with pytest.raises(InputError, match="--worker-egress is for --cloud gcp"):
        check_options("aws", HeadOptions(worker_egress="public"), boots=PlayedBoots())
    with pytest.raises(InputError, match="--worker-egress 'open': use nat"):
        check_options(
            "gcp", HeadOptions(worker_egress="open", service_account="h@p.iam.gserviceaccount.com"), boots=PlayedBoots()
        )
    check_options(
        "gcp", HeadOptions(worker_egress="existing", service_account="h@p.iam.gserviceaccount.com"), boots=PlayedBoots()
    )
    record = HeadRecord(
        run_id="r",
        cloud="gcp",
        region="us-central1",
        instance_id="rb-r-0-abc",
        zone="us-central1-a",
        address="10.0.0.2",
        public_address=None,
        regions=["us-central1"],
        metric="loss",
    )
    record.write(tmp_path)
    assert HeadRecord.read(tmp_path).worker_egress == "nat"
    for private, egress in ((True, "existing"), (False, "public")):
        data = json.loads((tmp_path / "head.json").read_text())
        data.pop("worker_egress", None)
        (tmp_path / "head.json").write_text(json.dumps({**data, "private_workers": private}))
        assert HeadRecord.read(tmp_path).worker_egress == egress
