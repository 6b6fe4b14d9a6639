//! Settings the stored data depends on, recorded at first use: a slot size
//! (`TIME_UNIT`) different from the one the table's slots were written with
//! would make readers skip parts of old slots and the scan file a
//! redelivered record under a second key, so it is refused. The scan's
//! item: the scan records it, readers check theirs against it.

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity, ReturnValue};

use super::key;
use crate::error::{Error, Result};

const TIME_UNIT: &str = "time_unit";

/// Records `unit_ms` as the table's slot size if none is recorded yet, and
/// fails with a clear error if another one is. One `UpdateItem`.
pub(crate) async fn ensure_time_unit(dynamo: &aws_sdk_dynamodb::Client, table: &str, unit_ms: u64) -> Result<()> {
    let out = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key("settings".to_owned())))
        .update_expression("SET #unit = if_not_exists(#unit, :unit)")
        .expression_attribute_names("#unit", TIME_UNIT)
        .expression_attribute_values(":unit", AttributeValue::N(unit_ms.to_string()))
        .return_values(ReturnValue::AllNew)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("UpdateItem", e))?;
    let recorded = out.attributes().and_then(|item| item.get(TIME_UNIT)).and_then(|v| v.as_n().ok());
    check(unit_ms, recorded.map(String::as_str), table)
}

/// Fails with a clear error if the table's slots were written with another
/// slot size than `unit_ms` (a reader's check: nothing recorded yet means
/// nothing is sealed yet, so nothing can be misread). One `GetItem`.
pub(crate) async fn check_time_unit(dynamo: &aws_sdk_dynamodb::Client, table: &str, unit_ms: u64) -> Result<()> {
    match time_unit(dynamo, table).await? {
        Some(recorded) => check(unit_ms, Some(&recorded.to_string()), table),
        None => Ok(()),
    }
}

/// The table's recorded slot size, if any is recorded yet.
pub async fn time_unit(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<Option<u64>> {
    let out = dynamo
        .get_item()
        .table_name(table)
        .set_key(Some(key("settings".to_owned())))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| Error::dynamo("GetItem", e))?;
    Ok(out.item().and_then(|item| item.get(TIME_UNIT)).and_then(|v| v.as_n().ok()).and_then(|n| n.parse().ok()))
}

fn check(unit_ms: u64, recorded: Option<&str>, table: &str) -> Result<()> {
    match recorded.map(str::parse::<u64>) {
        Some(Ok(recorded)) if recorded == unit_ms => Ok(()),
        Some(Ok(recorded)) => Err(Error::Config(format!(
            "TIME_UNIT is {unit_ms} ms, but the slots of table {table} were written with TIME_UNIT={recorded}: \
             set it back to {recorded} (another slot size needs a new event table)"
        ))),
        _ => Err(Error::Malformed(format!("{table}: the recorded TIME_UNIT is missing or not a number"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_unit_than_the_recorded_one_is_refused_with_both_named() {
        assert!(check(1000, Some("1000"), "events").is_ok());
        let err = check(500, Some("1000"), "events").unwrap_err().to_string();
        assert!(err.contains("TIME_UNIT is 500") && err.contains("TIME_UNIT=1000"), "{err}");
        assert!(matches!(check(1000, None, "events"), Err(Error::Malformed(_))));
    }
}
