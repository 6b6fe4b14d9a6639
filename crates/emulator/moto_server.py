"""moto_server, with stream appends made atomic and its request path lighter.

moto numbers a shard's next record by reading the highest sequence number
and adding one, without a lock (its own comment: "not safe for
concurrency"), while its server answers requests on many threads. Two
PutRecord calls on one shard at once can then get the same sequence number:
both callers are told the put succeeded, and one record is gone. Kinesis
never does that (a stored record keeps its own sequence number), so a
pipeline under concurrent load would see events lost that AWS would keep.
This launcher takes a lock around moto's per-shard put (PutRecord and every
entry of PutRecords go through it) and around its per-shard read (which walks
the same dict, and would otherwise fail with a 500 when a put lands mid-walk),
then runs moto's own server main with the same arguments. The Makefile
installs it as .venv/bin/moto-server.

Its DynamoDB tables lose items the same way (below, at the lock), and its
DynamoDB streams have the same defect: a table's stream numbers a
change by the count of records before it, unlocked, so two writes at once
could share a number; a reader asking for the records after that number is
handed the second of them again and again, and never gets further. So the
append of a change to a table's stream is locked too (not when moto itself
maps the table's stream to a function, which it runs inside that append).

On SIGUSR1 it writes every thread's stack to stderr (the tests' watchdog
asks for it when a test hangs on a request).

Three changes for speed only, as a local stack keeps moto busy: werkzeug's
line per request is not written (a sixth of moto's time went to it, to a
stderr nobody reads); the list of moto's service modules is read from
disk once rather than on every request (moto lists and stats its package
directory to route each request, under a lock all requests share); and a
Query on a table's own key reads that partition's items only (moto sorts
every item of the table for each Query, so a poll of one small partition
cost as much as a scan of the whole table and grew with it; DynamoDB reads
the partition). The items, their order and the answer are the same.

And a TransactWriteItems keeps a copy of the items it names, not of their
tables: moto deep-copies the whole table once for every item a transaction
names, to put it back if the transaction is cancelled, so one transaction
of 99 items on a table of 1,500 small items took ~2 s (99 copies of 19 ms)
and grew with the table, while DynamoDB's does not. Here the named items
are copied before the transaction and put back if it fails; moto's copy
of a table, inside it, is the table itself. What a transaction writes, and
what a cancelled one leaves (nothing), are the same; a transaction moto
refuses without its own rollback (an entry of two operations) is put back
too, as DynamoDB writes nothing of it. Its changes reach the table's stream
when it ends, and only if it is not cancelled, as DynamoDB's do (moto
appended a cancelled put's record, then dropped it with the table it
replaced, so a reader could see it and the next change took its number).
Neither copy is isolated from other threads' writes to the same items, as
moto's was not: the fault proxy's transactions-alone lane isolates them.

A deleted event source mapping stops, as in AWS: moto forgot it but left it
on its table (or Kinesis stream), which went on running the function (in
Docker) inside every write, and a table whose mapped function cannot run
there kept no stream record of the write; a reader standing in for the
mapping (tests/gateways.py) deletes moto's and reads the stream itself.
"""

import copy
import faulthandler
import functools
import signal
import sys
import threading

from moto import backends
from moto.awslambda import models as lambda_models
from moto.dynamodb import models as dynamodb_models
from moto.dynamodb.models import table as dynamodb_table
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.kinesis import models
from moto.server import main
from werkzeug.serving import WSGIRequestHandler

def _locked(method, lock):
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with lock:
            return method(self, *args, **kwargs)

    return locked


_kinesis = threading.Lock()
models.Shard.put_record = _locked(models.Shard.put_record, _kinesis)
models.Shard.get_records = _locked(models.Shard.get_records, _kinesis)
_table_streams = threading.Lock()
# A transaction on this thread: `changes` holds its table-stream changes until it ends.
_transaction = threading.local()
_add = dynamodb_table.StreamShard.add
_add_locked = _locked(_add, _table_streams)


def _add_to_table_stream(self, old, new):
    # A change inside a transaction waits for its end (below): a cancelled one emits nothing.
    held = getattr(_transaction, "changes", None)
    if held is not None:
        # As they are now: moto's later writes change an item in place.
        held.append((self, copy.deepcopy(old), copy.deepcopy(new)))
        return None
    # A table with moto's own event source mapping runs the mapped function
    # (in Docker) inside add: not under the lock every table's writes share.
    if self.table.lambda_event_source_mappings:
        return _add(self, old, new)
    return _add_locked(self, old, new)


dynamodb_table.StreamShard.add = _add_to_table_stream

# A table's items are a defaultdict of partitions, and moto's get_item,
# put_item and delete_item index it, so a partition missing on two threads
# at once is created twice and the second replaces the first: an item just
# written into the first is gone, its write answered 200 (seen as a scan
# that put 600 events and stored 598). DynamoDB loses no acknowledged write,
# so those three are locked (not on a table moto maps to a function itself:
# it runs the function, which may write back, inside the write).
_table_items = threading.RLock()


def _locked_unless_mapped(method):
    locked = _locked(method, _table_items)

    @functools.wraps(method)
    def item_access(self, *args, **kwargs):
        if getattr(self, "lambda_event_source_mappings", None):
            return method(self, *args, **kwargs)
        return locked(self, *args, **kwargs)

    return item_access


for _name in ("get_item", "put_item", "delete_item"):
    setattr(dynamodb_table.Table, _name, _locked_unless_mapped(getattr(dynamodb_table.Table, _name)))

class _CopyButNotTables:
    """The `copy` module, as moto's dynamodb backend sees it."""

    def __getattr__(self, name):
        return getattr(copy, name)

    def deepcopy(self, value, *args, **kwargs):
        if getattr(_transaction, "changes", None) is not None and isinstance(value, dynamodb_table.Table):
            return value
        return copy.deepcopy(value, *args, **kwargs)


dynamodb_models.copy = _CopyButNotTables()
_transact = dynamodb_models.DynamoDBBackend.transact_write_items


def _named_item(backend, entry):
    """(table, hash, range) of the item a transaction entry names; None when moto will refuse it."""
    try:
        _, op = next(iter(entry.items()))
        table = backend.tables[op["TableName"]]
        attributes = op.get("Key") or op["Item"]
        hash_value = DynamoType(attributes[table.hash_key_attr])
        range_value = DynamoType(attributes[table.range_key_attr]) if table.range_key_attr else None
        return table, hash_value, range_value
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, StopIteration):
        return None


def _put_back(table, hash_value, range_value, item):
    if range_value is None:
        if item is None:
            table.items.pop(hash_value, None)
        else:
            table.items[hash_value] = item
    elif item is None:
        table.items.get(hash_value, {}).pop(range_value, None)
    else:
        table.items[hash_value][range_value] = item


def _transact_copying_its_items(self, transact_items):
    saved = []
    with _table_items:
        for entry in transact_items:
            named = _named_item(self, entry)
            if named is None:
                continue
            table, hash_value, range_value = named
            try:
                found = table.items.get(hash_value)
                if found is not None and range_value is not None:
                    found = found.get(range_value)
            except TypeError:
                # A key of a type that cannot be hashed: moto refuses the entry before writing it.
                continue
            saved.append((*named, copy.deepcopy(found)))
    _transaction.changes = []
    try:
        result = _transact(self, transact_items)
    except Exception:
        with _table_items:
            # In reverse: an item named twice (which moto refuses) gets its first copy back.
            for table, hash_value, range_value, item in reversed(saved):
                _put_back(table, hash_value, range_value, item)
        raise
    finally:
        changes, _transaction.changes = _transaction.changes, None
    for shard, old, new in changes:
        _add_to_table_stream(shard, old, new)
    return result


dynamodb_models.DynamoDBBackend.transact_write_items = _transact_copying_its_items

# The partition a Query on this thread reads: (table, hash key), else None.
_querying = threading.local()
_all_items = dynamodb_table.Table.all_items
_query = dynamodb_table.Table.query


def _all_items_of_the_partition(self):
    only = getattr(_querying, "partition", None)
    if only is None or only[0] is not self:
        return _all_items(self)
    # .get: self.items is a defaultdict, and a read must not add a partition.
    try:
        found = self.items.get(only[1])
    except TypeError:
        # A key of a type that cannot be hashed (a list, a map): moto's own path answers it.
        return _all_items(self)
    if found is None:
        return []
    items = list(found.values()) if self.range_key_attr else [found]
    return sorted(items, key=lambda x: (x.hash_key, x.range_key) if x.range_key else x.hash_key)


def _query_one_partition(self, hash_key, *args, **kwargs):
    # args: range_comparison, range_objs, limit, exclusive_start_key,
    # scan_index_forward, projection_expressions, index_name, ... (moto 5.2.5)
    index_name = args[6] if len(args) > 6 else kwargs.get("index_name")
    if index_name or hash_key is None:
        return _query(self, hash_key, *args, **kwargs)
    _querying.partition = (self, hash_key)
    try:
        return _query(self, hash_key, *args, **kwargs)
    finally:
        _querying.partition = None


dynamodb_table.Table.all_items = _all_items_of_the_partition
dynamodb_table.Table.query = _query_one_partition

_delete_mapping = lambda_models.LambdaBackend.delete_event_source_mapping


def _delete_mapping_from_its_source(self, uuid):
    mapping = _delete_mapping(self, uuid)
    if mapping is not None:
        # Tables hold their mappings by function, streams by source; a write may be going through
        # the dict on another thread, so it is replaced, not changed.
        tables = dynamodb_models.dynamodb_backends[self.account_id][self.region_name].tables.values()
        streams = models.kinesis_backends[self.account_id][self.region_name].streams.values()
        for source in (*tables, *streams):
            kept = {k: m for k, m in source.lambda_event_source_mappings.items() if m is not mapping}
            if len(kept) != len(source.lambda_event_source_mappings):
                source.lambda_event_source_mappings = kept
    return mapping


lambda_models.LambdaBackend.delete_event_source_mapping = _delete_mapping_from_its_source

_modules = backends.list_of_moto_modules
backends.list_of_moto_modules = functools.cache(lambda: tuple(_modules()))


def _no_request_line(self, *args, **kwargs):
    pass


WSGIRequestHandler.log_request = _no_request_line

if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    sys.exit(main())
