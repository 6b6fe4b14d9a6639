"""template.yaml, proven offline: translated by the SAM translator, linted as
CloudFormation, deployed into moto's CloudFormation with the real arm64
bootstraps, and the deployed functions run under `cargo lambda watch`
against the deployed resources with the sample events of events/."""

import ast
import base64
import copy
import hashlib
import hmac
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile

import pytest
from cfnlint.api import lint_all
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

from conftest import BINARIES, REGION, ROOT, free_port, wait_for_port

FUNCTIONS = ["load", "pump", "scan", "playback", "subscriptions", "streams", "relay", "archive", "privacy", "keys"]
BUCKET = "event-store-artifacts"
PARAMETERS = {"Stage": "ci", "IpSalt": "ci-salt-0123456789abcdef", "SubjectHashKey": "ci-subject-hash-key-0123456789abcdef"}
PREFIX = "event-store-ci"
# Resource types the emulator's CloudFormation does not create (it skips them
# with a warning); docs/testing.md lists the same.
UNSUPPORTED = {"AWS::ApiGatewayV2::Api", "AWS::ApiGatewayV2::Stage", "AWS::CloudWatch::Alarm",
               "AWS::Lambda::EventInvokeConfig", "AWS::Lambda::Alias", "AWS::S3::BucketPolicy", "AWS::Glue::Database", "AWS::Glue::Table",
               "AWS::SNS::TopicPolicy"}


class NoManagedPolicyLookup:
    """The template names no managed policy by name, so none is looked up in IAM."""

    def load(self):
        return {}


def sam_template():
    return yaml_parse((ROOT / "template.yaml").read_text())


def translate(template):
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    return transform(copy.deepcopy(template), dict(PARAMETERS), NoManagedPolicyLookup())


def packaged(template):
    """What `sam package` does: CodeUri folders become S3 objects."""
    template = copy.deepcopy(template)
    for name in FUNCTIONS:
        props = template["Resources"][f"{name.capitalize()}Function"]["Properties"]
        assert props["CodeUri"] == f"target/lambda/{name}/"
        props["CodeUri"] = {"Bucket": BUCKET, "Key": f"{name}.zip"}
    return template


def bootstrap_zip(name):
    path = ROOT / "target" / "lambda" / name / "bootstrap"
    assert path.exists(), f"{path} missing: run `make build` (make test builds them itself)"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        info = zipfile.ZipInfo("bootstrap")
        info.external_attr = 0o755 << 16
        z.writestr(info, path.read_bytes())
    return buffer.getvalue()


def problems(template):
    """cfn-lint errors and warnings (informational findings are advice, not faults)."""
    return [str(m) for m in lint_all(json.dumps(template)) if m.rule.id[0] in "EW"]


# cfn-lint's region data has no AWS::Lambda::Url in these regions; the function
# URL is off by default (PixelFunctionUrl), and docs/deploy.md says to leave it
# off there. Any other finding, and any other region, still fails.
NO_FUNCTION_URL = {"ap-east-2", "ap-south-2", "ap-southeast-4", "ap-southeast-5", "ap-southeast-6",
                   "ap-southeast-7", "ca-west-1", "cn-northwest-1", "eu-central-2", "il-central-1",
                   "me-central-1", "mx-central-1", "us-gov-east-1", "us-gov-west-1"}


def test_translated_template_passes_cfn_lint():
    found = problems(translate(packaged(sam_template())))
    url = re.compile(r"\[E3006: .*\] \(Resource type 'AWS::Lambda::Url' does not exist in '([a-z0-9-]+)'\)")
    regions = {m.group(1) for m in map(url.match, found) if m}
    assert regions <= NO_FUNCTION_URL, "a region lost function URLs: add it to docs/deploy.md"
    assert [p for p in found if not url.match(p)] == []


def test_each_route_is_throttled_and_post_events_at_its_own_rate():
    """The stage SAM makes throttles the pixel routes by default and POST /events by its own
    settings, on a route the API's definition holds (else the stage cannot be created)."""
    translated = translate(packaged(sam_template()))
    resources = translated["Resources"]
    stage = next(r["Properties"] for r in resources.values() if r["Type"] == "AWS::ApiGatewayV2::Stage")
    assert stage["DefaultRouteSettings"]["ThrottlingRateLimit"] == {"Ref": "ApiRateLimit"}
    assert stage["RouteSettings"]["POST /events"] == {
        "ThrottlingRateLimit": {"Ref": "EventsRateLimit"}, "ThrottlingBurstLimit": {"Ref": "EventsBurstLimit"}}
    api = next(r["Properties"] for r in resources.values() if r["Type"] == "AWS::ApiGatewayV2::Api")
    assert "post" in api["Body"]["paths"]["/events"]


def test_translation_catches_what_sam_validate_misses():
    """A bad !GetAtt inside a Serverless::Function only shows after translation."""
    broken = packaged(sam_template())
    broken["Resources"]["PumpFunction"]["Properties"]["Environment"]["Variables"]["DYNAMO_BUFFER_TABLE"] = {
        "Fn::GetAtt": ["NoSuchTable", "Arn"]}
    assert any("NoSuchTable" in p for p in problems(translate(broken)))


@pytest.fixture(scope="module")
def stack(aws):
    s3 = aws("s3")
    s3.create_bucket(Bucket=BUCKET)
    for name in FUNCTIONS:
        s3.put_object(Bucket=BUCKET, Key=f"{name}.zip", Body=bootstrap_zip(name))
    translated = translate(packaged(sam_template()))
    cfn = aws("cloudformation")
    cfn.create_stack(StackName=PREFIX, TemplateBody=json.dumps(translated),
                     Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in PARAMETERS.items()],
                     Capabilities=["CAPABILITY_IAM"])
    status = cfn.describe_stacks(StackName=PREFIX)["Stacks"][0]["StackStatus"]
    assert status == "CREATE_COMPLETE", status
    created = {r["LogicalResourceId"]: r for r in cfn.list_stack_resources(StackName=PREFIX)["StackResourceSummaries"]}
    return translated, created


def test_every_supported_resource_is_created_and_the_rest_is_known(stack):
    translated, created = stack
    declared = translated["Resources"]
    # Resources under a condition the test's parameters leave false (the function URL) are not created.
    off = {"UseFunctionUrl", "HasAlarmEmail"}
    missing = {name: r["Type"] for name, r in declared.items() if name not in created and r.get("Condition") not in off}
    assert set(missing.values()) == UNSUPPORTED, missing
    assert {r["ResourceType"] for r in created.values()} >= {
        "AWS::DynamoDB::Table", "AWS::Kinesis::Stream", "AWS::Lambda::Function", "AWS::IAM::Role",
        "AWS::Lambda::EventSourceMapping", "AWS::Events::Rule", "AWS::Lambda::Permission",
        "AWS::SQS::Queue", "AWS::SNS::Topic"}


def test_tables_and_streams_are_keyed_as_declared(stack, aws):
    dynamo = aws("dynamodb")
    buffer = dynamo.describe_table(TableName=f"{PREFIX}-buffer-table")["Table"]
    assert buffer["KeySchema"] == [{"AttributeName": "id", "KeyType": "HASH"}]
    events = dynamo.describe_table(TableName=f"{PREFIX}-event-table")["Table"]
    assert events["KeySchema"] == [{"AttributeName": "slot", "KeyType": "HASH"},
                                   {"AttributeName": "sort_key", "KeyType": "RANGE"}]
    assert not events.get("LocalSecondaryIndexes")
    assert events["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    entity = dynamo.describe_table(TableName=f"{PREFIX}-entity-table")["Table"]
    assert entity["KeySchema"] == [{"AttributeName": "stream", "KeyType": "HASH"},
                                   {"AttributeName": "item", "KeyType": "RANGE"}]
    assert entity["StreamSpecification"] == {"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"}
    kinesis = aws("kinesis")
    for stream in (f"{PREFIX}-stream", f"{PREFIX}-playback"):
        assert kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["OpenShardCount"] == 1


def test_functions_run_bootstrap_on_arm64_with_their_own_environment(stack, aws):
    translated, _ = stack
    lam = aws("lambda")
    env = {}
    for name in FUNCTIONS:
        # The emulator's CloudFormation records every function as x86_64 without
        # tracing or log settings, so those are checked in the template it was given.
        declared = translated["Resources"][f"{name.capitalize()}Function"]["Properties"]
        assert declared["Architectures"] == ["arm64"]
        assert declared["TracingConfig"] == {"Mode": "Active"}
        assert declared["LoggingConfig"]["LogFormat"] == "JSON"
        config = lam.get_function_configuration(FunctionName=f"{PREFIX}-{name}")
        assert config["Runtime"] == "provided.al2023"
        assert config["Handler"] == "bootstrap"
        env[name] = config["Environment"]["Variables"]
    assert env["load"]["EVENT_STREAM"] == f"{PREFIX}-stream"
    # moto hands a Number parameter back as a number; AWS as a string.
    assert {k: str(v) for k, v in env["pump"].items()} == {"DYNAMO_BUFFER_TABLE": f"{PREFIX}-buffer-table", "DYNAMO_EVENT_TABLE": f"{PREFIX}-event-table",
                           "DYNAMO_ENTITY_TABLE": f"{PREFIX}-entity-table", "TIME_UNIT": "1000",
                           "SCAN_FUNCTION": f"{PREFIX}-scan"}, "the pump cuts chunks at the scan's slots, and wakes the scan"
    assert env["scan"]["DYNAMO_EVENT_TABLE"] == f"{PREFIX}-event-table"
    assert env["scan"]["EVENT_STREAM"] == f"{PREFIX}-stream", "the scan asks the event stream what is not buffered"
    assert env["playback"]["PLAYBACK_STREAM"] == f"{PREFIX}-playback"
    assert env["subscriptions"]["DYNAMO_EVENT_TABLE"] == f"{PREFIX}-event-table"
    assert env["subscriptions"]["METRICS_NAMESPACE"] == f"EventStore/{PREFIX}", "where the lag alarm looks"
    relay = {k: str(v) for k, v in env["relay"].items()}
    assert relay.pop("RELAY_DLQ_URL").endswith(f"/{PREFIX}-relay-dlq"), "where a held stream is announced"
    assert relay == {"EVENT_STREAM": f"{PREFIX}-stream", "DYNAMO_ENTITY_TABLE": f"{PREFIX}-entity-table",
                     "RELAY_HOLD_AFTER_SECONDS": "300"}
    bucket = env["archive"]["ARCHIVE_BUCKET"]
    assert bucket.startswith(f"{PREFIX}-archive-") and str(env["archive"]["HOT_RETENTION_DAYS"]) == "30"
    assert env["playback"]["ARCHIVE_BUCKET"] == env["subscriptions"]["ARCHIVE_BUCKET"] == bucket, "readers read the archive"
    # Large payloads: load and streams offload to the same bucket; streams reads the log (GET /log).
    assert env["load"]["ARCHIVE_BUCKET"] == bucket and str(env["load"]["INLINE_MAX_BYTES"]) == "65536"
    streams = {k: str(v) for k, v in env["streams"].items()}
    assert streams == {
        "DYNAMO_ENTITY_TABLE": f"{PREFIX}-entity-table", "ARCHIVE_BUCKET": bucket, "INLINE_MAX_BYTES": "65536",
        "KEY_TABLE": f"{PREFIX}-key-table", "KEY_FUNCTION": f"{PREFIX}-keys",
        "SUBJECT_HASH_KEY": PARAMETERS["SubjectHashKey"], "STREAM_SUBJECTS": "all", "KEY_CACHE_SECONDS": "60",
        "VIEW_TABLE": f"{PREFIX}-view-table", "DYNAMO_EVENT_TABLE": f"{PREFIX}-event-table"}
    # Projections' views: kept by the subscriptions function, read on /views, forgotten by privacy.
    assert env["subscriptions"]["VIEW_TABLE"] == env["privacy"]["VIEW_TABLE"] == f"{PREFIX}-view-table"
    # Writers ask the keys function for new keys; only it makes them, under the stack's own KMS key.
    assert env["load"]["KEY_FUNCTION"] == f"{PREFIX}-keys" and "SUBJECT_KMS_KEY" not in env["load"]
    assert env["keys"]["SUBJECT_KMS_KEY"].startswith("arn:aws:kms:") and env["keys"]["KEY_TABLE"] == f"{PREFIX}-key-table"
    # (The emulator's CloudFormation creates the bucket but not its settings: tests/template.rs checks those.)
    assert bucket in [b["Name"] for b in aws("s3").list_buckets()["Buckets"]]


def test_relay_is_wired_to_the_entity_table_stream(stack, aws):
    mappings = aws("lambda").list_event_source_mappings(FunctionName=f"{PREFIX}-relay")["EventSourceMappings"]
    assert len(mappings) == 1
    mapping = mappings[0]
    assert f":table/{PREFIX}-entity-table/stream/" in mapping["EventSourceArn"]
    assert mapping.get("FunctionResponseTypes") == ["ReportBatchItemFailures"]
    assert mapping["DestinationConfig"]["OnFailure"]["Destination"].endswith(f":{PREFIX}-relay-dlq")
    # Only inserts of batch items reach the relay (not tips, snapshots, nor its own positions).
    pattern = json.loads(mapping["FilterCriteria"]["Filters"][0]["Pattern"])
    assert pattern == {"eventName": ["INSERT"], "dynamodb": {"Keys": {"item": {"S": [{"prefix": "e"}]}}}}


def test_pump_is_wired_to_the_event_stream_with_partial_failures_and_a_dead_letter_queue(stack, aws):
    mappings = aws("lambda").list_event_source_mappings(FunctionName=f"{PREFIX}-pump")["EventSourceMappings"]
    assert len(mappings) == 1
    mapping = mappings[0]
    assert mapping["EventSourceArn"].endswith(f":stream/{PREFIX}-stream")
    assert mapping["BatchSize"] == 500, "the template default: two shard-position requests per batch, spread over 500 records"
    assert mapping.get("FunctionResponseTypes") == ["ReportBatchItemFailures"]
    assert mapping.get("BisectBatchOnFunctionError") is True
    assert mapping["DestinationConfig"]["OnFailure"]["Destination"].endswith(f":{PREFIX}-pump-dlq")


def test_scan_and_subscriptions_are_scheduled_and_allowed_to_be_invoked_by_the_schedule(stack, aws):
    events = aws("events")
    rules = [r for r in events.list_rules()["Rules"] if r.get("ScheduleExpression")]
    assert sorted(r["ScheduleExpression"] for r in rules) == ["rate(1 minute)", "rate(1 minute)", "rate(5 minutes)"]
    targets = sorted(t["Arn"].split(":")[-1] for r in rules for t in events.list_targets_by_rule(Rule=r["Name"])["Targets"])
    assert targets == [f"{PREFIX}-archive", f"{PREFIX}-scan", f"{PREFIX}-subscriptions"]
    for function in ("scan", "subscriptions", "archive"):
        policy = json.loads(aws("lambda").get_policy(FunctionName=f"{PREFIX}-{function}")["Policy"])
        assert any(s["Principal"] == {"Service": "events.amazonaws.com"} for s in policy["Statement"])


def test_the_dashboard_is_created_with_the_stack_s_own_names(stack, aws):
    """CloudFormation's substitution of the body (moto's) yields JSON that
    names this stack's functions, queues and stream, and the store's metrics."""
    body = json.loads(aws("cloudwatch").get_dashboard(DashboardName=PREFIX)["DashboardBody"])
    metrics = [m for w in body["widgets"] for m in w["properties"]["metrics"]]
    dimensions = {m[3] for m in metrics if len(m) > 3 and isinstance(m[3], str)}
    assert {f"{PREFIX}-{name}" for name in FUNCTIONS} <= dimensions, dimensions
    queues = {url.rsplit("/", 1)[-1] for url in aws("sqs").list_queues()["QueueUrls"] if PREFIX in url}
    assert queues and queues <= dimensions, (queues, dimensions)
    assert f"{PREFIX}-stream" in dimensions, "the event stream's ingest"
    names = {(m[0], m[1]) for m in metrics}
    assert {(f"EventStore/{PREFIX}", "WatermarkLagSeconds"), (f"EventStore/{PREFIX}", "SubscriptionLagSeconds")} <= names


def test_roles_grant_only_named_resources(stack, aws):
    iam = aws("iam")
    _, created = stack
    roles = [r["PhysicalResourceId"] for r in created.values() if r["ResourceType"] == "AWS::IAM::Role"]
    assert len(roles) == len(FUNCTIONS)
    for role in roles:
        for name in iam.list_role_policies(RoleName=role)["PolicyNames"]:
            document = iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
            if isinstance(document, str):  # the emulator answers the document as Python text
                document = ast.literal_eval(document)
            for statement in document["Statement"]:
                actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                assert all("*" not in a for a in actions), statement
                assert statement["Resource"] != "*", statement


# ---- the functions for real, under the Lambda runtime API emulator ---------

def cargo_lambda():
    return shutil.which("cargo-lambda") or str(ROOT / ".venv" / "bin" / "cargo-lambda")


@pytest.fixture(scope="module")
def watch(stack, aws, moto_endpoint):
    lam = aws("lambda")
    env = {"AWS_ENDPOINT_URL": moto_endpoint, "AWS_REGION": REGION,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "RUST_LOG": "info"}
    for name in FUNCTIONS:  # the deployed functions' environment, as CloudFormation resolved it
        env.update(lam.get_function_configuration(FunctionName=f"{PREFIX}-{name}")["Environment"]["Variables"])
    # The runtime emulator gives each invocation Lambda's default 3 s, not the
    # template's timeout: a 10 s margin would hand every page to a continuation.
    env["DEADLINE_MARGIN_MS"] = "500"
    port = free_port()
    # Self-invocations (scan forks) go to the runtime emulator's Invoke API, which names functions
    # by their binaries': so do the writers' calls to the keys function. (Every function gets the
    # union of the environments: a writer given KEY_FUNCTION asks it, whatever else it is given.)
    env["AWS_ENDPOINT_URL_LAMBDA"] = f"http://127.0.0.1:{port}"
    env["KEY_FUNCTION"] = "keys"
    # The sample events take each step by hand (the pump's batch, then a scheduled scan): the pump
    # wakes no scan here, nor the scan the subscriptions (tests/scan.rs covers both against the emulator).
    env.pop("SCAN_FUNCTION")
    env.pop("SUBSCRIPTIONS_TICK")
    env_vars = ",".join(f"{k}={v}" for k, v in env.items() if v != "")
    process = subprocess.Popen(
        [cargo_lambda(), "lambda", "watch", "--ignore-changes", "-A", "127.0.0.1", "-P", str(port),
         "--concurrency", "8", "--env-vars", env_vars],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 120)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def invoke(port, function, event_file):
    out = subprocess.run(
        [cargo_lambda(), "lambda", "invoke", function, "--invoke-port", str(port), "--invoke-address", "127.0.0.1",
         "--data-file", str(ROOT / "events" / event_file), "--output-format", "json"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)  # the first call may compile
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_sample_events_under_cargo_lambda_watch(watch, aws):
    response = invoke(watch, "load", "load.json")
    assert response["statusCode"] == 200
    assert response["headers"]["content-type"] == "image/gif"
    body = base64.b64decode(response["body"]) if response.get("isBase64Encoded") else response["body"].encode()
    assert len(body) == 43 and body.startswith(b"GIF89a")
    kinesis = aws("kinesis")
    shard = kinesis.list_shards(StreamName=f"{PREFIX}-stream")["Shards"][0]["ShardId"]
    iterator = kinesis.get_shard_iterator(StreamName=f"{PREFIX}-stream", ShardId=shard,
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    records = kinesis.get_records(ShardIterator=iterator)["Records"]
    # Sealed under user-42's key (KeyTable, SubjectKey): the user id is nowhere in the clear.
    [record] = records
    sealed = json.loads(record["Data"])
    assert len(sealed["subject"]) == 64 and sealed["sealed"]["g"] == 0 and sealed["query"] == {}, sealed
    assert "user-42" not in record["Data"].decode() and record["PartitionKey"] == sealed["subject"]
    assert aws("dynamodb").scan(TableName=f"{PREFIX}-key-table", Select="COUNT")["Count"] == 2, "head and g#0"

    assert invoke(watch, "pump", "pump.json") == {"batchItemFailures": []}
    dynamo = aws("dynamodb")
    buffered = dynamo.scan(TableName=f"{PREFIX}-buffer-table")["Items"]
    assert [(b["encoding"]["S"], b["count"]["N"]) for b in buffered] == [("chunk1", "2")], \
        "both records of one shard and one slot packed into one chunk"

    scheduled = invoke(watch, "scan", "scan.json")
    assert scheduled["forked"] == 1, "one run per scan segment (ScanSegments, 1 by default)"
    assert dynamo.scan(TableName=f"{PREFIX}-buffer-table", Select="COUNT")["Count"] == 0, "the forks moved both"
    chunks = dynamo.scan(TableName=f"{PREFIX}-event-table", FilterExpression="slot >= :zero",
                         ExpressionAttributeValues={":zero": {"N": "0"}})["Items"]
    assert [c["count"]["N"] for c in chunks] == ["2"], \
        "one chunk of two events (the bookkeeping partition, slot -2, holds index and watermark)"

    summary = invoke(watch, "playback", "playback.json")
    assert (summary["status"], summary["events"], summary["slots"]) == ("complete", 2, 1)
    assert summary["first_event"] == "2026-11-01T05:58:44.123Z"

    # The playback stream, read the way a consumer with AWS's deaggregation module does.
    played = deaggregated(kinesis, f"{PREFIX}-playback")
    assert summary["kinesis_records"] == 1, "both events of user-42 in one aggregated record"
    assert [(key, event["playback_seq"], event["event_time"]) for key, event in played] == [
        ("user-42", 0, "2026-11-01T05:58:44.123Z"), ("user-42", 1, "2026-11-01T05:58:44.456Z")]
    assert played[0][1]["data"] == {"id": "1b4e8c60", "path": "/track.gif"}
    assert base64.b64decode(played[1][1]["data_base64"]) == b"\x00\xff\x10not json"

    # A subscription from the beginning onto a stream of its own (named as the role allows:
    # <service>-<stage>-sub-*), created by the function; its partition's runner delivers both.
    kinesis.create_stream(StreamName=f"{PREFIX}-sub-e2e", ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(StreamName=f"{PREFIX}-sub-e2e")
    created = invoke(watch, "subscriptions", "subscription-create.json")
    assert created["created"]["target"] == {"kinesis": f"{PREFIX}-sub-e2e"}
    run = invoke(watch, "subscriptions", "subscription-run.json")
    assert (run["status"], run["delivered"]) == ("caught_up", 2), run
    delivered = deaggregated(kinesis, f"{PREFIX}-sub-e2e")
    assert [(key, event["subscription"], event["event_time"]) for key, event in delivered] == [
        ("user-42", "e2e", "2026-11-01T05:58:44.123Z"), ("user-42", "e2e", "2026-11-01T05:58:44.456Z")]
    listed = invoke(watch, "subscriptions", "subscription-list.json")
    assert [(s["name"], s["lag_ms"]) for s in listed["subscriptions"]] == [("e2e", 0)]

    # An entity stream: two events appended in one request, then the relay puts the batch's
    # stream record on the event stream, one record per event, keyed streams/<name>.
    appended = invoke(watch, "streams", "streams-append.json")
    assert appended["statusCode"] == 201, appended
    assert appended["headers"]["etag"] == '"1"'
    assert json.loads(appended["body"])["versions"] == [0, 1]
    again = invoke(watch, "streams", "streams-append.json")
    assert (again["statusCode"], again["headers"]["etag"]) == (201, '"1"'), "the same request: the original answer"
    assert invoke(watch, "relay", "relay.json") == {"batchItemFailures": []}
    records = kinesis.get_records(ShardIterator=iterator)["Records"]
    relayed = [json.loads(r["Data"]) for r in records if r["PartitionKey"] == "streams/todo-e2e"]
    assert [(e["id"], e["body"]["type"]) for e in relayed] == [("todo-e2e/0", "TodoCreated"), ("todo-e2e/1", "TodoUpdated")]


# ---- `event-store --stack`, as a user runs it against the deployed stack ----------

def cli_env(moto_endpoint, **extra):
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_endpoint, "AWS_REGION": REGION,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", **extra}
    for name in ("AWS_PROFILE", "EVENT_STORE_STACK", "EMULATOR_PORT", "PORT"):
        env.pop(name, None)
    return env


def event_store(args, env, stdin=None):
    """`event-store --stack <the deployed stack> args`: (exit code, stdout, stderr)."""
    binary = BINARIES / "event-store"
    assert binary.exists(), "build it first: cargo build -p event-store-cli (make test does)"
    out = subprocess.run([str(binary), "--stack", PREFIX, *args], env=env, input=stdin,
                         capture_output=True, text=True, timeout=300)
    return out.returncode, out.stdout, out.stderr


@pytest.fixture(scope="module")
def gateways(watch):
    from botocore.credentials import Credentials
    from gateways import LambdaService, SignedApi
    lam = LambdaService(watch, PREFIX)
    # With a session token, as temporary credentials (SSO, a role) have: it is signed too.
    api = SignedApi(watch, Credentials("testing", "testing", "a-session-token"), REGION)
    try:
        yield lam, api
    finally:
        lam.close()
        api.close()


def outputs_of(aws):
    stack = aws("cloudformation").describe_stacks(StackName=PREFIX)["Stacks"][0]
    return {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}


def test_the_cli_drives_the_deployed_stack(watch, gateways, aws, moto_endpoint):
    """subscription, playback, streams, redrive and status with --stack: the deployed functions
    invoked through Lambda's API, the streams API through a SigV4 check, the queues from the
    stack's outputs. Runs after the sample events (their subscription, their two events)."""
    lam, api = gateways
    env = cli_env(moto_endpoint, AWS_ENDPOINT_URL_LAMBDA=f"http://127.0.0.1:{lam.port}",
                  AWS_SESSION_TOKEN="a-session-token")
    kinesis, dynamo, sqs = aws("kinesis"), aws("dynamodb"), aws("sqs")
    outputs = outputs_of(aws)
    try:
        drive_the_deployed_stack(lam, api, env, kinesis, dynamo, sqs, outputs, moto_endpoint)
    finally:  # whatever failed, the next test finds the queues empty
        for url in (outputs["PumpDeadLetterQueueUrl"], outputs["RelayDeadLetterQueueUrl"]):
            drain(sqs, url)


def drain(sqs, url):
    """Deletes every message of the queue (PurgeQueue allows one call a minute)."""
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        for message in messages:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


def drive_the_deployed_stack(lam, api, env, kinesis, dynamo, sqs, outputs, moto_endpoint):

    # subscription: the function's answer, invoked synchronously.
    code, out, err = event_store(["subscription", "list"], env)
    assert code == 0, err
    assert [s["name"] for s in json.loads(out)["subscriptions"]] == ["e2e"]
    assert lam.invocations[-1] == ("subscriptions", "RequestResponse")

    # playback: invoked asynchronously, then followed by its checkpoint to the end.
    def pixel_hits_played():
        return len([e for _, e in deaggregated(kinesis, f"{PREFIX}-playback") if e.get("data", {}).get("path")])

    before = pixel_hits_played()
    window = ["--start", "2026-11-01T05:58:00Z", "--end", "2026-11-01T05:59:00Z"]
    code, out, err = event_store(["--json", "playback", *window, "--filter", "/path=/track.gif"], env)
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["status"], summary["events"]) == ("complete", 1), summary
    assert ("playback", "Event") in lam.invocations
    assert pixel_hits_played() == before + 1, "the window's one pixel hit (the sample event), played again"
    code, out, err = event_store(["playback", *window, "--filter", "/path=/track.gif"], env)
    assert (code, lam.invocations.count(("playback", "Event"))) == (0, 1), "already played: not invoked again"
    assert "was already played back (1 events" in out, out
    # The same window by two runs at once, each the keys of its half: one invocation each, followed together.
    code, out, err = event_store(["--json", "playback", *window, "--filter", "/path=/track.gif", "--parallel", "2"], env)
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["status"], summary["events"], summary["id"][-5:]) == ("complete", 1, "-*of2"), summary
    assert lam.invocations.count(("playback", "Event")) == 3, "one more invocation for each of the 2 runs"
    assert pixel_hits_played() == before + 2, "the window's pixel hit, played by the run of its key"
    hour_on = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600 * h)) for h in (1, 2)]
    code, out, err = event_store(["playback", "--start", hour_on[0], "--end", hour_on[1]], env)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, (code, err)

    # streams: SigV4-signed with the caller's credentials, checked by botocore's signer.
    streams = ["streams", "--url", f"http://127.0.0.1:{api.port}/streams"]
    todo = '[{"type":"TodoCreated","data":{"title":"milk"}},{"type":"TodoDone","data":{}}]'
    code, out, err = event_store(["--json", *streams, "append", "todo-cli", "--new", todo], env)
    assert code == 0, err
    assert (json.loads(out)["status"], json.loads(out)["version"]) == (201, "1")
    code, out, err = event_store([*streams, "append", "todo-cli", "--expect", "0", "-"], env,
                                 stdin='{"type":"TodoRenamed","data":{}}')
    assert (code, err.strip()) == (1, "409 Conflict, version 1"), out
    code, out, err = event_store([*streams, "read", "todo-cli"], env)
    assert code == 0, err
    assert [e["type"] for e in json.loads(out)["events"]] == ["TodoCreated", "TodoDone"]
    assert (api.verified, api.refused) == (3, [])
    wrong = cli_env(moto_endpoint, AWS_SECRET_ACCESS_KEY="not-the-key", AWS_SESSION_TOKEN="a-session-token")
    code, out, err = event_store([*streams, "read", "todo-cli"], wrong)
    assert code == 3 and "403" in err, (code, err)
    assert api.refused == ["The request signature we calculated does not match the signature you provided"]

    # redrive: a failure record in each dead-letter queue, as the event source mappings write them.
    shard = kinesis.list_shards(StreamName=f"{PREFIX}-stream")["Shards"][0]["ShardId"]
    put = kinesis.put_record(StreamName=f"{PREFIX}-stream", PartitionKey="dlq", Data=b'{"path":"/redriven"}')
    stream_arn = kinesis.describe_stream_summary(StreamName=f"{PREFIX}-stream")["StreamDescriptionSummary"]["StreamARN"]
    sqs.send_message(QueueUrl=outputs["PumpDeadLetterQueueUrl"], MessageBody=json.dumps({
        "requestContext": {"condition": "RetryAttemptsExhausted", "approximateInvokeCount": 3},
        "version": "1.0", "timestamp": "2026-11-27T06:00:00.000Z",
        "KinesisBatchInfo": {"shardId": shard, "startSequenceNumber": put["SequenceNumber"],
                             "endSequenceNumber": put["SequenceNumber"], "streamArn": stream_arn, "batchSize": 1}}))
    table_stream = dynamo.describe_table(TableName=outputs["EntityTableName"])["Table"]["LatestStreamArn"]
    sqs.send_message(QueueUrl=outputs["RelayDeadLetterQueueUrl"], MessageBody=json.dumps({
        "requestContext": {"condition": "RetryAttemptsExhausted", "approximateInvokeCount": 3},
        "version": "1.0", "timestamp": "2026-11-27T06:00:00.000Z",
        "DDBStreamBatchInfo": {"shardId": "shardId-00000001", "startSequenceNumber": "1", "endSequenceNumber": "1",
                               "streamArn": table_stream, "batchSize": 1}}))
    code, out, err = event_store(["--json", "status"], env)
    queued = {q["name"]: q["messages"] for q in json.loads(out)["queues"]}
    assert (code, queued["pump dead-letter queue"], queued["relay dead-letter queue"]) == (1, 1, 1), out
    code, out, err = event_store(["redrive"], env)
    assert code == 0, out + err
    assert "pump dead-letter queue: drained 1 messages (1 records buffered again)" in out, out
    assert "relay dead-letter queue: drained 1 messages" in out, out
    for url in (outputs["PumpDeadLetterQueueUrl"], outputs["RelayDeadLetterQueueUrl"]):
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert (attributes["ApproximateNumberOfMessages"], attributes["ApproximateNumberOfMessagesNotVisible"]) == ("0", "0")
    buffered = dynamo.scan(TableName=f"{PREFIX}-buffer-table")["Items"]
    assert [b["count"]["N"] for b in buffered] == ["1"], "the re-driven record, buffered in a chunk of its own"
    records = kinesis.get_records(ShardIterator=kinesis.get_shard_iterator(
        StreamName=f"{PREFIX}-stream", ShardId=shard, ShardIteratorType="TRIM_HORIZON")["ShardIterator"])["Records"]
    relayed = [json.loads(r["Data"])["id"] for r in records if r["PartitionKey"] == "streams/todo-cli"]
    assert relayed == ["todo-cli/0", "todo-cli/1"], "the appends the relay had not delivered, relayed by the re-drive"

    # status: no schedule runs the pump or the scan under the runtime emulator, so the watermark
    # stalls and the verdict says since when. (The sample pump event's sequence numbers are
    # AWS-shaped, beyond moto's, so the pump's saved position lies past every record here and the
    # shard's probe sees none after it: `pump behind on <shard>` is checked on the local stack,
    # crates/cli/tests/status.rs.)
    # forget: the privacy function, invoked with the caller's ARN. A caller IAM does not let invoke it
    # is refused and nothing is forgotten; a second forget says so; an unknown subject is bad usage.
    user_42 = hmac.new(PARAMETERS["SubjectHashKey"].encode(), b"user-42", hashlib.sha256).hexdigest()

    def user_42_keys():
        items = dynamo.query(TableName=f"{PREFIX}-key-table", KeyConditionExpression="subject = :s",
                             ExpressionAttributeValues={":s": {"S": user_42}})["Items"]
        return {i["item"]["S"]: i for i in items}

    assert "wrapped" in user_42_keys()["g#0000000000"], "load sealed the pixel hit of user-42 under its key"
    lam.denied.add(("intruder", "privacy"))
    code, out, err = event_store(["forget", "user-42"], {**env, "AWS_ACCESS_KEY_ID": "intruder"})
    assert code == 4 and "AccessDeniedException" in err, (code, out, err)
    assert "wrapped" in user_42_keys()["g#0000000000"], "nothing forgotten"
    code, out, err = event_store(["forget", "user-42"], env)
    assert code == 0 and "1 key generation(s) destroyed" in out, out + err
    assert lam.invocations[-1] == ("privacy", "RequestResponse")
    keys = user_42_keys()
    assert "wrapped" not in keys["g#0000000000"] and keys["head"]["state"]["S"] == "forgotten", keys
    [record] = [i for name, i in keys.items() if name.startswith("forgot#")]
    assert record["by"]["S"].startswith("arn:aws:"), "the caller, from STS"
    code, out, err = event_store(["--json", "forget", "user-42"], env)
    # The stream of that name too, under the streams' own hash (crypto::stream_subject_hash), recomputed here.
    streams_key = hmac.new(PARAMETERS["SubjectHashKey"].encode(), b"event-store: entity streams as data subjects, v1",
                           hashlib.sha256).digest()
    stream_42 = hmac.new(streams_key, b"user-42", hashlib.sha256).hexdigest()
    assert code == 0 and json.loads(out) == {"subject": user_42, "stream_subject": stream_42, "forgotten": "already",
                                             "generations": 0, "view_items": 0}, out
    code, out, err = event_store(["forget", "nobody"], env)
    assert code == 2 and "nothing to forget" in out, out + err

    time.sleep(2)
    code, out, err = event_store(["--json", "status", "--stall-after", "1"], env)
    problems = json.loads(out)["verdict"]["problems"]
    assert code == 1 and any(re.match(r"watermark stalled at \S+ \(.+ behind now\)", p) for p in problems), problems
    code, out, err = event_store(["status"], env)
    assert out.splitlines()[-1].startswith("verdict") and "\x1b" not in out, out


def test_status_finds_the_deployed_stack_by_its_outputs_and_names_a_queued_message(stack, aws, moto_endpoint):
    """`event-store --stack NAME status`, as a user runs it against the deployed stack."""
    env = cli_env(moto_endpoint)

    def status():
        code, out, err = event_store(["status", "--json"], env)
        assert code in (0, 1), err
        return code, json.loads(out)

    _, before = status()
    assert before["target"] == f"stack {PREFIX} ({REGION})"
    assert [(q["name"], q["messages"]) for q in before["queues"]] == [
        ("pump dead-letter queue", 0), ("relay dead-letter queue", 0), ("failure queue", 0)]
    shards = aws("kinesis").list_shards(StreamName=f"{PREFIX}-stream")["Shards"]
    assert [s["shard"] for s in before["shards"]] == [s["ShardId"] for s in shards]
    outputs = outputs_of(aws)
    sqs = aws("sqs")
    sqs.send_message(QueueUrl=outputs["PumpDeadLetterQueueUrl"], MessageBody="{}")
    try:
        code, after = status()
        assert code == 1, after
        assert any(p.startswith("1 message in the pump dead-letter queue") for p in after["verdict"]["problems"]), after
    finally:
        drain(sqs, outputs["PumpDeadLetterQueueUrl"])


def deaggregated(kinesis, stream):
    """Every user record on `stream` as (partition key, played event), unpacked by
    aws_kinesis_agg (AWS's own deaggregator, from PyPI), each shard in order."""
    from aws_kinesis_agg.deaggregator import deaggregate_records
    out = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"],
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        records = kinesis.get_records(ShardIterator=iterator, Limit=10000)["Records"]
        # The shape a Lambda Kinesis event gives the module.
        lambda_shaped = [{"eventID": f"{shard['ShardId']}:{r['SequenceNumber']}", "kinesis": {
            "partitionKey": r["PartitionKey"], "sequenceNumber": r["SequenceNumber"],
            "data": base64.b64encode(r["Data"]).decode(), "kinesisSchemaVersion": "1.0",
            "approximateArrivalTimestamp": r["ApproximateArrivalTimestamp"].timestamp()}} for r in records]
        for user_record in deaggregate_records(lambda_shaped):
            kinesis_part = user_record["kinesis"]
            out.append((kinesis_part["partitionKey"], json.loads(base64.b64decode(kinesis_part["data"]))))
    return out


# ---- the clients (clients/python, clients/typescript) against the deployed API --------

def test_the_clients_run_their_scenario_on_the_deployed_stack(watch, gateways, aws):
    """tests/client_scenario.py's steps, from both clients, through `SignedApi` (every request's
    signature checked with botocore's signer) to the deployed streams function, while `Mappings`
    stand in for the event source mappings and the schedule: the relay, the pump and the scan run
    as deployed, so the clients follow the log until it has sealed what they appended."""
    import client_scenario
    from botocore.credentials import Credentials
    from event_store_client import EventStore
    from gateways import Mappings
    _, api = gateways
    dynamo = aws("dynamodb")
    # The sample pump event's AWS-shaped sequence numbers left the shard's position past every record
    # moto writes: the pump starts the shard again (its records are each buffered once, by event id).
    for item in dynamo.scan(TableName=f"{PREFIX}-event-table", FilterExpression="begins_with(sort_key, :p)",
                            ExpressionAttributeValues={":p": {"S": "shard#"}})["Items"]:
        dynamo.delete_item(TableName=f"{PREFIX}-event-table", Key={"slot": item["slot"], "sort_key": item["sort_key"]})
    url = f"http://127.0.0.1:{api.port}"
    verified, refused, cut = api.verified, len(api.refused), api.cut
    with Mappings(watch, aws, PREFIX, outputs_of(aws)["EntityTableName"]) as mappings:
        store = EventStore(url, region=REGION, credentials=Credentials("testing", "testing", "a-session-token"))
        python = client_scenario.run(store, url)
        typescript = client_scenario.run_typescript(url, {
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "a-session-token",
            "AWS_REGION": REGION, "AWS_PROFILE": "", "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"})
    assert mappings.errors == [], mappings.errors[:5]
    assert len(api.refused) == refused, api.refused[refused:]
    assert api.cut - cut == 2 and api.verified - verified > 40, (api.cut - cut, api.verified - verified)
    print(f"deployed: {api.verified - verified} signed requests verified; the log showed {python} and {typescript}")
