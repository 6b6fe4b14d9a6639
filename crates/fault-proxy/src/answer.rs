//! How each request is answered: forwarded upstream, or with the fault drawn for it (whole or partial).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::faults::{applicable, error_answer, target, Fault, Service};
use crate::state::State;
use crate::Applied;

type Answer = Result<Response<Full<Bytes>>, std::io::Error>;

fn respond(status: StatusCode, headers: Option<&HeaderMap>, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    if let Some(headers) = headers {
        for (name, value) in headers {
            // The body may have changed: its length and checksum are recomputed or dropped.
            if name != CONTENT_LENGTH && name != TRANSFER_ENCODING && name.as_str() != "x-amz-crc32" {
                response.headers_mut().append(name, value.clone());
            }
        }
    }
    if !response.headers().contains_key(CONTENT_TYPE) {
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/x-amz-json-1.0"));
    }
    response
}

fn json_response(status: StatusCode, headers: Option<&HeaderMap>, value: &Value) -> Response<Full<Bytes>> {
    respond(status, headers, Bytes::from(value.to_string()))
}

pub(crate) async fn handle(state: Arc<State>, req: Request<Incoming>) -> Answer {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
    let header = parts.headers.get("x-amz-target").and_then(|v| v.to_str().ok());
    let (service, operation) = target(header);
    state.count("requests");
    if service == Service::Kms && state.kms_disabled.load(std::sync::atomic::Ordering::SeqCst) {
        state.count("KmsDisabled");
        let message = "arn:aws:kms:us-east-1:123456789012:key/injected is disabled.";
        return Ok(json_response(
            StatusCode::BAD_REQUEST,
            None,
            &json!({ "__type": "DisabledException", "message": message }),
        ));
    }
    if service == Service::Kinesis && operation == "PutRecords" {
        if let Some(held) = refused_entries(&state, &body) {
            state.count("RefusedKey");
            return partial_put_records(&state, &parts, body, held).await;
        }
    }
    let mut faults = applicable(service, &operation);
    if let Some(only) = state.only {
        faults.retain(|f| only.contains(f));
    }
    let (fault, detail) = state.draw(&faults);
    let Some(fault) = fault else {
        let (status, headers, bytes) = state.forward(&parts, body).await?;
        return Ok(respond(status, Some(&headers), bytes));
    };
    state.count("faults");
    state.count(fault.name());
    match fault {
        Fault::ConnectionReset => Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "injected reset")),
        Fault::Slow => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (status, headers, bytes) = state.forward(&parts, body).await?;
            Ok(respond(status, Some(&headers), bytes))
        }
        Fault::AppliedThenInternalError => {
            let applied = describe(service, &operation, &body);
            state.forward(&parts, body).await?;
            if let Ok(mut log) = state.applied.lock() {
                log.push(applied);
            }
            let (status, value) = error_answer(service, fault);
            Ok(json_response(status, None, &value))
        }
        Fault::PartialBatchWrite => partial_batch_write(&state, &parts, body, detail).await,
        Fault::PartialPutRecords => {
            let entries = describe(service, &operation, &body).entries;
            partial_put_records(&state, &parts, body, held_back(entries, detail)).await
        }
        _ => {
            let (status, value) = error_answer(service, fault);
            Ok(json_response(status, None, &value))
        }
    }
}

/// What an applied request was: its operation, the stream or table it names, its entries.
fn describe(service: Service, operation: &str, body: &Bytes) -> Applied {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let prefix = match service {
        Service::DynamoDb => "DynamoDB",
        Service::Kinesis => "Kinesis",
        Service::Kms => "TrentService",
        Service::Other => "Other",
    };
    let named = |field: &str| request.get(field).and_then(Value::as_str).map(str::to_owned);
    let target = named("StreamName")
        .or_else(|| named("StreamARN"))
        .or_else(|| named("TableName"))
        .or_else(|| request.get("RequestItems").and_then(Value::as_object).and_then(|t| t.keys().next().cloned()))
        .unwrap_or_default();
    let entries = match request.get("Records").and_then(Value::as_array) {
        Some(records) => records.len(),
        None => request
            .get("RequestItems")
            .and_then(Value::as_object)
            .map_or(1, |tables| tables.values().filter_map(Value::as_array).map(Vec::len).sum()),
    };
    Applied { operation: format!("{prefix}.{operation}"), target, entries }
}

/// Which of `n` entries to hold back: a non-empty pseudo-random subset.
fn held_back(n: usize, detail: u64) -> Vec<bool> {
    let mut rng = fastrand::Rng::with_seed(detail);
    let mut held: Vec<bool> = (0..n).map(|_| rng.bool()).collect();
    if n > 0 && !held.contains(&true) {
        held[rng.usize(..n)] = true;
    }
    held
}

async fn partial_batch_write(state: &State, parts: &hyper::http::request::Parts, body: Bytes, detail: u64) -> Answer {
    let mut request: Value = serde_json::from_slice(&body).map_err(std::io::Error::other)?;
    let mut unprocessed = serde_json::Map::new();
    if let Some(tables) = request.get_mut("RequestItems").and_then(Value::as_object_mut) {
        for (table, writes) in tables.iter_mut() {
            let Some(list) = writes.as_array_mut() else { continue };
            let held = held_back(list.len(), detail);
            let (kept, dropped): (Vec<_>, Vec<_>) = list.drain(..).zip(held).partition(|(_, h)| !h);
            *list = kept.into_iter().map(|(w, _)| w).collect();
            unprocessed.insert(table.clone(), Value::Array(dropped.into_iter().map(|(w, _)| w).collect()));
        }
        tables.retain(|_, writes| writes.as_array().is_some_and(|l| !l.is_empty()));
    }
    let nothing_left = request["RequestItems"].as_object().is_none_or(|t| t.is_empty());
    let (status, headers, mut answer) = if nothing_left {
        (StatusCode::OK, None, json!({}))
    } else {
        let (status, headers, bytes) = state.forward(parts, Bytes::from(request.to_string())).await?;
        (status, Some(headers), serde_json::from_slice(&bytes).map_err(std::io::Error::other)?)
    };
    if status != StatusCode::OK {
        return Ok(json_response(status, headers.as_ref(), &answer));
    }
    let merged = answer.as_object_mut().map(|a| a.entry("UnprocessedItems").or_insert_with(|| json!({})));
    if let Some(Value::Object(merged)) = merged {
        for (table, writes) in unprocessed {
            let entry = merged.entry(table).or_insert_with(|| json!([]));
            if let (Some(list), Value::Array(more)) = (entry.as_array_mut(), writes) {
                list.extend(more);
            }
        }
    }
    Ok(json_response(StatusCode::OK, headers.as_ref(), &answer))
}

/// Which entries of a `PutRecords` request name a refused partition key; `None` when none do.
fn refused_entries(state: &State, body: &Bytes) -> Option<Vec<bool>> {
    let keys = state.refused_keys.lock().ok()?;
    if keys.is_empty() {
        return None;
    }
    let request: Value = serde_json::from_slice(body).ok()?;
    let held: Vec<bool> = request
        .get("Records")?
        .as_array()?
        .iter()
        .map(|r| r.get("PartitionKey").and_then(Value::as_str).is_some_and(|k| keys.contains(k)))
        .collect();
    held.contains(&true).then_some(held)
}

/// Forwards the entries not `held` and answers for all of them, the held ones failed.
async fn partial_put_records(
    state: &State,
    parts: &hyper::http::request::Parts,
    body: Bytes,
    held: Vec<bool>,
) -> Answer {
    let mut request: Value = serde_json::from_slice(&body).map_err(std::io::Error::other)?;
    let records = request.get_mut("Records").and_then(Value::as_array_mut).map(std::mem::take).unwrap_or_default();
    let sent: Vec<Value> = records.iter().zip(&held).filter(|(_, h)| !**h).map(|(r, _)| r.clone()).collect();
    let mut results: Vec<Value> = Vec::new();
    let mut headers = None;
    if !sent.is_empty() {
        request["Records"] = Value::Array(sent);
        let (status, upstream_headers, bytes) = state.forward(parts, Bytes::from(request.to_string())).await?;
        let answer: Value = serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
        if status != StatusCode::OK {
            return Ok(json_response(status, Some(&upstream_headers), &answer));
        }
        results = answer["Records"].as_array().cloned().unwrap_or_default();
        headers = Some(upstream_headers);
    }
    let mut upstream = results.into_iter();
    let mut failed = 0;
    let merged: Vec<Value> = held
        .iter()
        .map(|&h| {
            if h {
                failed += 1;
                json!({"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "injected: rate exceeded for shard"})
            } else {
                let result = upstream.next().unwrap_or_else(|| json!({"ErrorCode": "InternalFailure", "ErrorMessage": "missing"}));
                if result.get("ErrorCode").is_some() {
                    failed += 1;
                }
                result
            }
        })
        .collect();
    Ok(json_response(StatusCode::OK, headers.as_ref(), &json!({ "FailedRecordCount": failed, "Records": merged })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn something_is_always_held_back() {
        for seed in 0..50 {
            let held = held_back(3, seed);
            assert_eq!(held.len(), 3);
            assert!(held.contains(&true));
        }
        assert!(held_back(0, 1).is_empty());
    }
}
