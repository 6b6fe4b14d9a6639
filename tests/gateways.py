"""What AWS puts in front of the deployed functions, for the deploy tests,
where the functions run under `cargo lambda watch` (moto runs Lambda only in
Docker and creates no API Gateway):

- `LambdaService`: Lambda's Invoke API for the stack's function names,
  asynchronous invocations (`X-Amz-Invocation-Type: Event`) answered 202 at
  once and run after, as Lambda does; the runtime emulator serves functions
  by binary name and runs every invocation synchronously.
- `SignedApi`: API Gateway's `AWS_IAM` authorization in front of the streams
  function: every request's SigV4 signature is checked with botocore's
  signer (a reader nobody here wrote), then the request is handed to the
  function as an HTTP API event; an unsigned or wrongly signed one is 403.
- `Proxy`: a plain pass-through to `make local`'s server.

All bind 127.0.0.1 on a free port and stop with `close()`. The last two lose
an answer on request: a `POST /_cut-next-answer` (unsigned) makes the next
request reach the store and its connection close without an answer, as a
connection cut after the store acted does."""

import base64
import hmac
import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

INVOKE = "/2015-03-31/functions/"


def _forward(method, url, body, headers):
    request = urllib.request.Request(url, data=body if method != "GET" else None, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read()


CUT = "/_cut-next-answer"
#: Request headers the API hands on to the function (besides its own), and answer headers it returns.
# (Not a stream's `accept`: these answer whole, and the deployed API does not stream.)
PASSED = ("content-type", "if-match", "if-none-match", "traceparent", "tracestate")
KEPT = ("content-type", "etag", "location", "retry-after")


class _Server:
    def __init__(self, handler):
        self.lock = threading.Lock()
        self.cut_next = False
        self.cut = 0  # answers lost so far
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def arm(self):
        with self.lock:
            self.cut_next = True

    def take_cut(self):
        """Whether the request arriving now is the one to lose its answer (one request only)."""
        with self.lock:
            cut, self.cut_next = self.cut_next, False
            self.cut += cut
            return cut


class LambdaService(_Server):
    """Invoke for `<prefix>-<function>` goes to `<function>` under the runtime emulator on `watch_port`."""

    def __init__(self, watch_port, prefix):
        self.invocations = []  # (function, invocation type), in order
        self.finished = []  # asynchronous invocations done: (function, status)
        # (access key id, function) pairs IAM would not allow to invoke: answered as Lambda does.
        self.denied = set()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def do_POST(self):
                path = self.path.split("?")[0]
                name = path[len(INVOKE):].split("/")[0] if path.startswith(INVOKE) else ""
                function = name[len(prefix) + 1:] if name.startswith(prefix + "-") else None
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if function is None:
                    return self._answer(404, {"Type": "User", "message": f"Function not found: {name}"},
                                        {"x-amzn-errortype": "ResourceNotFoundException"})
                caller = self.headers.get("authorization", "").partition("Credential=")[2].split("/")[0]
                if (caller, function) in service.denied:
                    message = (f"User: arn:aws:iam::123456789012:user/{caller} is not authorized to perform: "
                               f"lambda:InvokeFunction on resource: {name}")
                    return self._answer(403, {"Type": "User", "Message": message},
                                        {"x-amzn-errortype": "AccessDeniedException"})
                kind = self.headers.get("x-amz-invocation-type", "RequestResponse")
                service.invocations.append((function, kind))
                url = f"http://127.0.0.1:{watch_port}{INVOKE}{function}/invocations"
                if kind == "Event":
                    def run():
                        status, _, _ = _forward("POST", url, body, {"content-type": "application/json"})
                        service.finished.append((function, status))
                    threading.Thread(target=run, daemon=True).start()
                    return self._answer(202, None, {})
                status, headers, answer = _forward("POST", url, body, {"content-type": "application/json"})
                extra = {k: v for k, v in headers.items() if k.lower() == "x-amz-function-error"}
                self._raw(status, answer, extra)

            def _answer(self, status, value, headers):
                self._raw(status, b"" if value is None else json.dumps(value).encode(), headers)

            def _raw(self, status, body, headers):
                self.send_response(status)
                self.send_header("content-type", "application/json")
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler)


class _Forwarding(BaseHTTPRequestHandler):
    """Hands each request to `self.upstream(path)` unless `self.refuse()` names a problem (403)."""
    owner: "_Server"

    def log_message(self, *_):
        pass

    def _handle(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == CUT:
            self.owner.arm()
            return self._send(204, {}, b"")
        problem = self.refuse(body)
        if problem:
            return self._send(403, {"content-type": "application/json"}, json.dumps({"message": problem}).encode())
        cut = self.owner.take_cut()
        passed = {k: v for k, v in self.headers.items() if k.lower() in PASSED}
        status, headers, answer = _forward(self.command, self.upstream(self.path), body, passed)
        if cut:
            self.close_connection = True
            return None  # the store acted; the caller never hears of it
        self._send(status, {k: v for k, v in headers.items() if k.lower() in KEPT}, answer)

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    def refuse(self, body):
        return None

    def upstream(self, path):
        raise NotImplementedError

    def _send(self, status, headers, body):
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Proxy(_Server):
    """Everything to `make local`'s server on `port`."""

    def __init__(self, port):
        class Handler(_Forwarding):
            owner = self

            def upstream(self, path):
                return f"http://127.0.0.1:{port}{path}"

        super().__init__(Handler)


class SignedApi(_Server):
    """`/streams/...`, signed for `execute-api` in `region` with `credentials`, to the streams function."""

    def __init__(self, watch_port, credentials: Credentials, region):
        self.verified = 0
        self.refused = []
        api = self

        class Handler(_Forwarding):
            owner = self

            def refuse(self, body):
                problem = api.check(self.command, f"http://{self.headers['host']}{self.path}", self.headers, body)
                with api.lock:
                    if problem:
                        api.refused.append(problem)
                    else:
                        api.verified += 1
                return problem

            def upstream(self, path):
                # The runtime emulator makes an HTTP API event of what follows /lambda-url/<function>.
                return f"http://127.0.0.1:{watch_port}/lambda-url/streams{path}"

        self.credentials, self.region = credentials, region
        super().__init__(Handler)

    def check(self, method, url, headers, body):
        """None when the request carries a valid signature of these credentials, else why not."""
        authorization = headers.get("authorization", "")
        if not authorization.startswith("AWS4-HMAC-SHA256 "):
            return "Missing Authentication Token"
        fields = dict(part.strip().split("=", 1) for part in authorization[len("AWS4-HMAC-SHA256 "):].split(","))
        signed = fields["SignedHeaders"].split(";")
        request = AWSRequest(method=method, url=url, data=body,
                             headers={name: headers[name] for name in signed if headers.get(name) is not None})
        stamp = headers.get("x-amz-date", "")
        request.context["timestamp"] = stamp
        signer = SigV4Auth(self.credentials, "execute-api", self.region)
        expected_scope = f"{self.credentials.access_key}/{stamp[:8]}/{self.region}/execute-api/aws4_request"
        if fields["Credential"] != expected_scope:
            return f"credential scope {fields['Credential']} is not {expected_scope}"
        canonical = signer.canonical_request(request)
        expected = signer.signature(signer.string_to_sign(request, canonical), request)
        if not hmac.compare_digest(expected, fields["Signature"]):
            return "The request signature we calculated does not match the signature you provided"
        return None


class Mappings:
    """What Lambda's event source mappings and the scan's schedule do for the deployed stack, while
    the runtime emulator runs its functions: every half second the entity table's new stream records
    go to `relay`, the event stream's new records to `pump` (as Lambda's batches, one shard at a time),
    and a scheduled event to `scan`. Each batch a function names a failure of is sent again.
    A context manager; `errors` holds what failed for good."""

    def __init__(self, watch_port, aws, prefix, entity_table):
        self.invoke_url = f"http://127.0.0.1:{watch_port}{INVOKE}" + "{}/invocations"
        self.kinesis, self.streams = aws("kinesis"), aws("dynamodbstreams")
        self.stream = f"{prefix}-stream"
        self.stream_arn = self.kinesis.describe_stream_summary(StreamName=self.stream)[
            "StreamDescriptionSummary"]["StreamARN"]
        self.table_stream = aws("dynamodb").describe_table(TableName=entity_table)["Table"]["LatestStreamArn"]
        # This stands in for both mappings: moto's own would run the functions in Docker inside each write
        # (which they cannot here), and a table would then keep no stream record of its writes.
        lam = aws("lambda")
        for source in (self.table_stream, self.stream_arn):
            for mapping in lam.list_event_source_mappings(EventSourceArn=source)["EventSourceMappings"]:
                lam.delete_event_source_mapping(UUID=mapping["UUID"])
        self.positions = {}  # (source, shard) -> the last sequence number handed on
        self.errors = []
        self.failing = 0  # passes failed in a row (one is retried at the next, as Lambda retries)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.stopping.set()
        self.thread.join(60)

    def _run(self):
        while not self.stopping.wait(0.5):
            try:
                self._relay()
                self._pump()
                self._invoke("scan", {"version": "0", "detail-type": "Scheduled Event", "source": "aws.events",
                                      "detail": {}, "resources": []})
                self.failing = 0
            except Exception as error:  # noqa: BLE001 - kept for the test to report
                self.failing += 1
                if self.failing >= 5:
                    self.errors.append(repr(error))

    def _invoke(self, function, event):
        status, headers, answer = _forward("POST", self.invoke_url.format(function), json.dumps(event).encode(),
                                           {"content-type": "application/json"})
        if status != 200 or any(k.lower() == "x-amz-function-error" for k in headers):
            raise RuntimeError(f"{function}: {status} {answer[:300]!r}")
        return json.loads(answer or b"null")

    def _iterator(self, client, source, shard, **names):
        after = self.positions.get((source, shard))
        named = "SequenceNumber" if source == "relay" else "StartingSequenceNumber"  # DynamoDB's, Kinesis'
        start = {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", named: after} if after \
            else {"ShardIteratorType": "TRIM_HORIZON"}
        return client.get_shard_iterator(ShardId=shard, **names, **start)["ShardIterator"]

    def _relay(self):
        shards = self.streams.describe_stream(StreamArn=self.table_stream)["StreamDescription"]["Shards"]
        for shard in (s["ShardId"] for s in shards):
            iterator = self._iterator(self.streams, "relay", shard, StreamArn=self.table_stream)
            records = self.streams.get_records(ShardIterator=iterator, Limit=100)["Records"]
            if not records:
                continue
            batch = [{**_plain(r), "eventSourceARN": self.table_stream} for r in records]
            self._hand_on("relay", shard, batch, [r["dynamodb"]["SequenceNumber"] for r in records])

    def _pump(self):
        for shard in (s["ShardId"] for s in self.kinesis.list_shards(StreamName=self.stream)["Shards"]):
            iterator = self._iterator(self.kinesis, "pump", shard, StreamName=self.stream)
            records = self.kinesis.get_records(ShardIterator=iterator, Limit=100)["Records"]
            if not records:
                continue
            batch = [{"kinesis": {"kinesisSchemaVersion": "1.0", "partitionKey": r["PartitionKey"],
                                  "sequenceNumber": r["SequenceNumber"], "data": base64.b64encode(r["Data"]).decode(),
                                  "approximateArrivalTimestamp": r["ApproximateArrivalTimestamp"].timestamp()},
                      "eventSource": "aws:kinesis", "eventVersion": "1.0", "eventID": f"{shard}:{r['SequenceNumber']}",
                      "eventName": "aws:kinesis:record", "awsRegion": self.kinesis.meta.region_name,
                      "eventSourceARN": self.stream_arn} for r in records]
            self._hand_on("pump", shard, batch, [r["SequenceNumber"] for r in records])

    def _hand_on(self, function, shard, batch, sequences):
        """Invokes `function` with the batch; moves past it up to its first failure (sent again next time)."""
        failed = {f["itemIdentifier"] for f in self._invoke(function, {"Records": batch}).get("batchItemFailures", [])}
        done = sequences[:next((i for i, s in enumerate(sequences) if s in failed), len(sequences))]
        if done:
            self.positions[(function, shard)] = done[-1]


def _plain(value):
    """A stream record as Lambda hands it on: JSON (bytes in base64, times in epoch seconds)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if hasattr(value, "timestamp"):
        return int(value.timestamp())
    return value
