//! Least privilege as AWS evaluates it (`docs/testing.md`): what IAM sees of
//! each request an SDK client sends (its action, the resource it names and
//! the condition keys that apply: `dynamodb:LeadingKeys`, `s3:if-none-match`),
//! recorded by an interceptor on the clients a test gives a function's code,
//! and the function's policies from template.yaml with their intrinsics
//! resolved for the stack the test runs. `tests/iam/simulate.cjs` evaluates
//! one against the other with @cloud-copilot/iam-simulate (AWS's policy logic:
//! Allow and Deny, wildcards, every condition operator), a reader nobody here
//! wrote. moto cannot: it checks resource `*` for DynamoDB, Kinesis, Lambda
//! and KMS, and evaluates no condition keys.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use serde::Serialize;
use serde_json::{json, Value};
use serde_yaml::Value as Yaml;

/// The account and region the emulator answers for.
pub const ACCOUNT: &str = "123456789012";
pub const REGION: &str = "us-east-1";

/// A request as IAM authorizes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IamRequest {
    pub action: String,
    pub resource: String,
    /// Condition keys with their values (multi-valued keys, such as `dynamodb:LeadingKeys`, as lists).
    pub context: BTreeMap<String, Vec<String>>,
}

impl IamRequest {
    pub fn new(action: &str, resource: String) -> Self {
        Self { action: action.to_owned(), resource, context: BTreeMap::new() }
    }

    pub fn with(mut self, key: &str, values: Vec<String>) -> Self {
        self.context.insert(key.to_owned(), values);
        self
    }
}

/// Records what IAM would see of each request of the clients counted by a
/// [`crate::request_counter::RequestCounter`] made with it.
#[derive(Debug, Clone, Default)]
pub struct IamRecorder {
    /// Each table's partition key attribute, by table name.
    hash_keys: Arc<HashMap<String, String>>,
    seen: Arc<Mutex<Vec<IamRequest>>>,
    /// The stream a `GetRecords` reads (its iterator names none): the last one an iterator was asked for.
    last_stream: Arc<Mutex<Option<String>>>,
}

impl IamRecorder {
    /// A recorder for tables whose partition keys are `hash_keys` (table name, attribute).
    pub fn new(hash_keys: HashMap<String, String>) -> Self {
        Self { hash_keys: Arc::new(hash_keys), ..Self::default() }
    }

    /// The requests so far, each once, in the order first seen.
    pub fn requests(&self) -> Vec<IamRequest> {
        let seen = self.seen.lock().map(|s| s.clone()).unwrap_or_default();
        let mut unique: Vec<IamRequest> = Vec::new();
        for request in seen {
            if !unique.contains(&request) {
                unique.push(request);
            }
        }
        unique
    }

    pub fn reset(&self) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.clear();
        }
    }

    fn of_http(
        &self,
        method: &str,
        uri: &str,
        target: Option<&str>,
        header: &dyn Fn(&str) -> Option<String>,
        body: &[u8],
    ) -> Vec<IamRequest> {
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        match target.and_then(|t| t.split_once('.')) {
            Some((service, op)) if service.starts_with("DynamoDB_") => dynamodb(op, &body, &self.hash_keys),
            Some((service, op)) if service.starts_with("Kinesis_") => {
                let stream = body["StreamARN"]
                    .as_str()
                    .and_then(|arn| arn.rsplit_once('/').map(|(_, name)| name.to_owned()))
                    .or_else(|| body["StreamName"].as_str().map(str::to_owned));
                let stream = match (op, stream) {
                    ("GetRecords", None) => self.last_stream.lock().ok().and_then(|s| s.clone()),
                    (_, Some(stream)) => {
                        if let Ok(mut last) = self.last_stream.lock() {
                            *last = Some(stream.clone());
                        }
                        Some(stream)
                    }
                    (_, None) => None,
                };
                let arn = format!("arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{}", stream.unwrap_or_default());
                vec![IamRequest::new(&format!("kinesis:{op}"), arn)]
            }
            Some(("TrentService", op)) => {
                let key = body["KeyId"].as_str().unwrap_or_default();
                let arn = if key.starts_with("arn:") {
                    key.to_owned()
                } else {
                    format!("arn:aws:kms:{REGION}:{ACCOUNT}:key/{key}")
                };
                vec![IamRequest::new(&format!("kms:{op}"), arn)]
            }
            Some(("AmazonSQS", op)) => {
                let name = body["QueueUrl"].as_str().and_then(|u| u.rsplit('/').next()).unwrap_or_default();
                vec![IamRequest::new(&format!("sqs:{op}"), format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"))]
            }
            _ => rest(method, uri, header),
        }
    }
}

/// A DynamoDB request: one IAM request per table (and, in a transaction, per item, as its own action).
fn dynamodb(op: &str, body: &Value, hash_keys: &HashMap<String, String>) -> Vec<IamRequest> {
    let table_arn = |table: &str| format!("arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}");
    let leading = |table: &str, item: &Value| -> Option<String> {
        let attribute = hash_keys.get(table)?;
        item.get(attribute).and_then(scalar)
    };
    let keyed = |action: &str, table: &str, keys: Vec<String>| {
        let request = IamRequest::new(action, table_arn(table));
        if keys.is_empty() {
            request
        } else {
            request.with("dynamodb:LeadingKeys", keys)
        }
    };
    let table = body["TableName"].as_str().unwrap_or_default();
    match op {
        "GetItem" | "DeleteItem" | "UpdateItem" => {
            vec![keyed(&format!("dynamodb:{op}"), table, leading(table, &body["Key"]).into_iter().collect())]
        }
        "PutItem" => vec![keyed("dynamodb:PutItem", table, leading(table, &body["Item"]).into_iter().collect())],
        "Query" => vec![keyed("dynamodb:Query", table, query_partition(table, body, hash_keys).into_iter().collect())],
        "BatchWriteItem" | "BatchGetItem" => {
            let mut out = Vec::new();
            for (table, requests) in body["RequestItems"].as_object().into_iter().flatten() {
                let items: Vec<&Value> = match requests {
                    Value::Array(writes) => writes
                        .iter()
                        .filter_map(|w| w["PutRequest"].get("Item").or_else(|| w["DeleteRequest"].get("Key")))
                        .collect(),
                    reads => reads["Keys"].as_array().map(|k| k.iter().collect()).unwrap_or_default(),
                };
                let mut keys: Vec<String> = items.iter().filter_map(|i| leading(table, i)).collect();
                keys.sort();
                keys.dedup();
                out.push(keyed(&format!("dynamodb:{op}"), table, keys));
            }
            out
        }
        "TransactWriteItems" | "TransactGetItems" => body["TransactItems"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| {
                let (kind, part) = item.as_object()?.iter().next()?;
                let action = match kind.as_str() {
                    "Put" => "dynamodb:PutItem",
                    "Update" => "dynamodb:UpdateItem",
                    "Delete" => "dynamodb:DeleteItem",
                    "ConditionCheck" => "dynamodb:ConditionCheckItem",
                    _ => "dynamodb:GetItem",
                };
                let table = part["TableName"].as_str().unwrap_or_default();
                let key = leading(table, part.get("Key").unwrap_or(&part["Item"]));
                Some(keyed(action, table, key.into_iter().collect()))
            })
            .collect(),
        other => vec![IamRequest::new(&format!("dynamodb:{other}"), table_arn(table))],
    }
}

/// The partition a `Query` reads: the value its key condition binds the table's partition key to.
fn query_partition(table: &str, body: &Value, hash_keys: &HashMap<String, String>) -> Option<String> {
    let attribute = hash_keys.get(table)?;
    let condition = body["KeyConditionExpression"].as_str()?;
    let names = &body["ExpressionAttributeNames"];
    condition.split(" AND ").find_map(|part| {
        let (name, value) = part.split_once('=')?;
        let name = name.trim();
        let name = names.get(name).and_then(Value::as_str).unwrap_or(name);
        (name == attribute).then(|| body["ExpressionAttributeValues"].get(value.trim()).and_then(scalar))?
    })
}

/// A DynamoDB attribute value's text (`{"N": "-2"}` → `-2`).
fn scalar(value: &Value) -> Option<String> {
    value.get("S").or_else(|| value.get("N")).and_then(Value::as_str).map(str::to_owned)
}

/// S3 (path-style) and Lambda: the REST APIs, by method and path.
fn rest(method: &str, uri: &str, header: &dyn Fn(&str) -> Option<String>) -> Vec<IamRequest> {
    let path = uri.split_once("://").map_or(uri, |(_, rest)| rest.find('/').map_or("", |i| &rest[i..]));
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    if let Some(function) = path.strip_prefix("/2015-03-31/functions/").and_then(|p| p.strip_suffix("/invocations")) {
        let function = percent_decode(function);
        let arn = if function.starts_with("arn:") {
            function
        } else {
            format!("arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function}")
        };
        return vec![IamRequest::new("lambda:InvokeFunction", arn)];
    }
    let path = percent_decode(path.trim_start_matches('/'));
    let (bucket, key) = path.split_once('/').unwrap_or((&path, ""));
    if key.is_empty() {
        let action = if method == "GET" && query.contains("list-type") { "s3:ListBucket" } else { "s3:HeadBucket" };
        return vec![IamRequest::new(action, format!("arn:aws:s3:::{bucket}"))];
    }
    let object = format!("arn:aws:s3:::{bucket}/{key}");
    match method {
        "PUT" => {
            let put = IamRequest::new("s3:PutObject", object);
            match header("if-none-match") {
                Some(value) => vec![put.with("s3:if-none-match", vec![value])],
                None => vec![put],
            }
        }
        "DELETE" => vec![IamRequest::new("s3:DeleteObject", object)],
        _ => vec![IamRequest::new("s3:GetObject", object)],
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl IamRecorder {
    /// Records a request about to be sent (from [`crate::request_counter::RequestCounter`]'s interceptor).
    pub(crate) fn record(&self, context: &BeforeTransmitInterceptorContextRef<'_>) {
        let request = context.request();
        let headers = request.headers();
        let header = |name: &str| headers.get(name).map(str::to_owned);
        let body = request.body().bytes().unwrap_or_default();
        let seen = self.of_http(request.method(), request.uri(), headers.get("x-amz-target"), &header, body);
        if let Ok(mut all) = self.seen.lock() {
            all.extend(seen);
        }
    }
}

/// The names the template's intrinsics resolve to for one stack: `Service`
/// and `Stage`, and the physical ids of resources that have no name of
/// their own in the template (the KMS key's id, say).
#[derive(Debug, Clone)]
pub struct Stack {
    pub service: String,
    pub stage: String,
    pub physical: HashMap<String, String>,
}

/// `function`'s (a logical id) inline policies, resolved for `stack`.
pub fn policies(template: &Yaml, function: &str, stack: &Stack) -> Vec<Value> {
    let policies = &template["Resources"][function]["Properties"]["Policies"];
    policies.as_sequence().into_iter().flatten().map(|p| resolve(template, p, stack)).collect()
}

/// A template value with `!Sub` and `!GetAtt X.Arn` resolved, as JSON.
fn resolve(template: &Yaml, value: &Yaml, stack: &Stack) -> Value {
    match value {
        Yaml::Tagged(tagged) if tagged.tag == "!Sub" => {
            Value::String(substitute(template, tagged.value.as_str().unwrap_or_default(), stack))
        }
        Yaml::Tagged(tagged) if tagged.tag == "!GetAtt" => {
            Value::String(attribute(template, tagged.value.as_str().unwrap_or_default(), stack))
        }
        Yaml::Tagged(tagged) if tagged.tag == "!Ref" => {
            Value::String(reference(template, tagged.value.as_str().unwrap_or_default(), stack))
        }
        Yaml::Mapping(map) => Value::Object(
            map.iter().map(|(k, v)| (k.as_str().unwrap_or_default().to_owned(), resolve(template, v, stack))).collect(),
        ),
        Yaml::Sequence(items) => Value::Array(items.iter().map(|v| resolve(template, v, stack)).collect()),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Number(n) => json!(n.as_f64()),
        Yaml::Bool(b) => Value::Bool(*b),
        _ => Value::Null,
    }
}

fn substitute(template: &Yaml, text: &str, stack: &Stack) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let end = start + rest[start..].find('}').unwrap_or(rest.len() - start);
        out.push_str(&rest[..start]);
        let name = &rest[start + 2..end];
        out.push_str(&match name.split_once('.') {
            Some(_) => attribute(template, name, stack),
            None => reference(template, name, stack),
        });
        rest = rest.get(end + 1..).unwrap_or("");
    }
    out.push_str(rest);
    out
}

/// `!Ref name`: a parameter's value, a pseudo parameter, or a resource's physical name.
fn reference(template: &Yaml, name: &str, stack: &Stack) -> String {
    match name {
        "AWS::Partition" => return "aws".into(),
        "AWS::Region" => return REGION.into(),
        "AWS::AccountId" => return ACCOUNT.into(),
        "Service" => return stack.service.clone(),
        "Stage" => return stack.stage.clone(),
        _ => {}
    }
    if let Some(id) = stack.physical.get(name) {
        return id.clone();
    }
    let parameter = &template["Parameters"][name]["Default"];
    if !parameter.is_null() {
        return match parameter {
            Yaml::Number(n) => n.to_string(),
            other => other.as_str().unwrap_or_default().to_owned(),
        };
    }
    let properties = &template["Resources"][name]["Properties"];
    let named = ["TableName", "Name", "FunctionName", "BucketName", "QueueName", "TopicName"]
        .iter()
        .map(|field| &properties[*field])
        .find(|v| !v.is_null());
    named
        .map(|v| resolve(template, v, stack))
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| name.to_owned())
}

/// `!GetAtt resource.Arn` (and a table's `StreamArn`), built as AWS builds them.
fn attribute(template: &Yaml, name: &str, stack: &Stack) -> String {
    let (resource, attribute) = name.split_once('.').unwrap_or((name, "Arn"));
    let id = reference(template, resource, stack);
    let kind = template["Resources"][resource]["Type"].as_str().unwrap_or_default();
    match (kind, attribute) {
        ("AWS::DynamoDB::Table", "StreamArn") => format!("arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{id}/stream/*"),
        ("AWS::DynamoDB::Table", _) => format!("arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{id}"),
        ("AWS::Kinesis::Stream", _) => format!("arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{id}"),
        ("AWS::Serverless::Function" | "AWS::Lambda::Function", _) => {
            format!("arn:aws:lambda:{REGION}:{ACCOUNT}:function:{id}")
        }
        ("AWS::KMS::Key", _) => format!("arn:aws:kms:{REGION}:{ACCOUNT}:key/{id}"),
        ("AWS::S3::Bucket", _) => format!("arn:aws:s3:::{id}"),
        ("AWS::SQS::Queue", "QueueName") => id,
        ("AWS::SQS::Queue", _) => format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{id}"),
        _ => format!("arn:aws:unknown:{REGION}:{ACCOUNT}:{resource}"),
    }
}

/// Evaluates each `(policies, request)` with `tests/iam/simulate.cjs` under
/// `root` (Node and the pinned simulator in `.node`, `make tools-node`):
/// `Allowed`, `ExplicitlyDenied` or `ImplicitlyDenied` each, or an error the
/// simulator found in the request or a policy.
pub fn evaluate(root: &Path, cases: &[(Vec<Value>, IamRequest)]) -> Result<Vec<String>, String> {
    use std::io::Write;
    let input: Vec<Value> =
        cases.iter().map(|(policies, request)| json!({"policies": policies, "request": request})).collect();
    let mut child = std::process::Command::new("node")
        .arg(root.join("tests/iam/simulate.cjs"))
        .env("NODE_PATH", root.join(".node/node_modules"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("node: {e} (make tools-node)"))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(Value::Array(input).to_string().as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder() -> IamRecorder {
        IamRecorder::new(HashMap::from([("events".to_owned(), "slot".to_owned())]))
    }

    #[test]
    fn dynamodb_requests_name_their_table_and_the_partitions_they_touch() {
        let body = json!({"TableName": "events", "KeyConditionExpression": "#slot = :s AND begins_with(#k, :p)",
            "ExpressionAttributeNames": {"#slot": "slot", "#k": "sort_key"},
            "ExpressionAttributeValues": {":s": {"N": "-2"}, ":p": {"S": "archive#"}}});
        let seen = recorder().of_http(
            "POST",
            "http://x/",
            Some("DynamoDB_20120810.Query"),
            &|_| None,
            body.to_string().as_bytes(),
        );
        let table = format!("arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/events");
        assert_eq!(
            seen,
            [IamRequest::new("dynamodb:Query", table.clone()).with("dynamodb:LeadingKeys", vec!["-2".into()])]
        );
        let batch = json!({"RequestItems": {"events": [
            {"PutRequest": {"Item": {"slot": {"N": "17"}, "sort_key": {"S": "a"}}}},
            {"DeleteRequest": {"Key": {"slot": {"N": "-1"}, "sort_key": {"S": "b"}}}},
            {"PutRequest": {"Item": {"slot": {"N": "17"}, "sort_key": {"S": "c"}}}}]}});
        let seen = recorder().of_http(
            "POST",
            "http://x/",
            Some("DynamoDB_20120810.BatchWriteItem"),
            &|_| None,
            batch.to_string().as_bytes(),
        );
        assert_eq!(
            seen,
            [IamRequest::new("dynamodb:BatchWriteItem", table.clone())
                .with("dynamodb:LeadingKeys", vec!["-1".into(), "17".into()])]
        );
        let transaction = json!({"TransactItems": [{"Update": {"TableName": "events", "Key": {"slot": {"N": "-2"}}}},
            {"ConditionCheck": {"TableName": "events", "Key": {"slot": {"N": "5"}}}}]});
        let seen = recorder().of_http(
            "POST",
            "http://x/",
            Some("DynamoDB_20120810.TransactWriteItems"),
            &|_| None,
            transaction.to_string().as_bytes(),
        );
        assert_eq!(
            seen[0],
            IamRequest::new("dynamodb:UpdateItem", table.clone()).with("dynamodb:LeadingKeys", vec!["-2".into()])
        );
        assert_eq!(seen[1].action, "dynamodb:ConditionCheckItem");
    }

    #[test]
    fn rest_requests_name_their_object_or_function_and_a_conditional_put_says_so() {
        let header = |name: &str| (name == "if-none-match").then(|| "*".to_owned());
        let put = recorder().of_http(
            "PUT",
            "http://127.0.0.1:5000/bucket/payloads/sha256/ab?x-id=PutObject",
            None,
            &header,
            b"",
        );
        assert_eq!(
            put,
            [IamRequest::new("s3:PutObject", "arn:aws:s3:::bucket/payloads/sha256/ab".into())
                .with("s3:if-none-match", vec!["*".into()])]
        );
        let list = recorder().of_http("GET", "http://127.0.0.1:5000/bucket?list-type=2&prefix=x", None, &|_| None, b"");
        assert_eq!(list[0].action, "s3:ListBucket");
        let invoke =
            recorder().of_http("POST", "http://h/2015-03-31/functions/es-ci-scan/invocations", None, &|_| None, b"");
        assert_eq!(invoke[0].resource, format!("arn:aws:lambda:{REGION}:{ACCOUNT}:function:es-ci-scan"));
        assert_eq!(percent_decode("a%3Ab%2Fc"), "a:b/c");
    }
}
