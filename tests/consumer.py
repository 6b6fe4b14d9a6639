"""A subscription consumer written from the documented rule alone
(docs/subscriptions.md, "The consumer's rule"), reading a Kinesis target the way a consumer would: every
shard, each in sequence order, records unpacked by AWS's deaggregator
(aws_kinesis_agg). Prints the events it processed, as JSON.

    python tests/consumer.py --endpoint URL --stream NAME [--rule key-seq|partition-position]

`key-seq` is the documented rule; `partition-position` is the rule the README
gave before (highest position per partition), kept to show what it loses.
Shards are read in reverse order (as if the first ones lagged): nothing in
the rule may depend on the order shards are read in."""
import argparse
import base64
import json

import boto3
from aws_kinesis_agg.deaggregator import deaggregate_records


def user_records(kinesis, stream):
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    for shard in reversed(shards):
        iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"],
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            out = kinesis.get_records(ShardIterator=iterator, Limit=10000)
            records = out["Records"]
            lambda_shaped = [{"eventID": f"{shard['ShardId']}:{r['SequenceNumber']}", "kinesis": {
                "partitionKey": r["PartitionKey"], "sequenceNumber": r["SequenceNumber"],
                "data": base64.b64encode(r["Data"]).decode(), "kinesisSchemaVersion": "1.0",
                "approximateArrivalTimestamp": r["ApproximateArrivalTimestamp"].timestamp()}} for r in records]
            for user_record in deaggregate_records(lambda_shaped):
                yield json.loads(base64.b64decode(user_record["kinesis"]["data"]))
            if not records and out.get("MillisBehindLatest", 0) == 0:
                break
            iterator = out.get("NextShardIterator")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--rule", default="key-seq", choices=["key-seq", "partition-position"])
    args = parser.parse_args()
    kinesis = boto3.client("kinesis", endpoint_url=args.endpoint, region_name="us-east-1",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
    highest = {}
    processed = []
    for event in user_records(kinesis, args.stream):
        if args.rule == "key-seq":
            mark, value = (event["subscription_id"], event["partition_key"]), event["playback_seq"]
        else:
            mark = (event["subscription"], event["partition"])
            value = (event["position"]["slot"], event["position"]["sort_key"])
        if not event.get("redriven"):  # a re-driven parked event was never delivered: always taken
            if mark in highest and value <= highest[mark]:
                continue  # a copy of an event already processed
            highest[mark] = value
        processed.append({"partition_key": event["partition_key"], "data": event.get("data")})
    print(json.dumps(processed))


if __name__ == "__main__":
    main()
