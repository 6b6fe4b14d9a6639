//! What a Kinesis event source mapping does before calling `pump`: turn
//! `GetRecords` results into the Lambda `KinesisEvent` shape. Used where
//! there is no event source mapping: the local stack and the tests.

/// The Lambda event for records read from a shard (the conversion is the
/// core crate's: the re-drive of given-up records uses it in production).
pub use event_store::kinesis::lambda_event as kinesis_event;

/// How many records of a delivered batch are done, the way an event source
/// mapping with `ReportBatchItemFailures` checkpoints: everything before the
/// first failed record. The rest (failed or not) is delivered again.
pub fn done_before_first_failure(
    sequences: &[&str],
    response: &aws_lambda_events::event::streams::KinesisEventResponse,
) -> usize {
    let failed: Vec<&str> = response.batch_item_failures.iter().filter_map(|f| f.item_identifier.as_deref()).collect();
    sequences.iter().position(|s| failed.contains(s)).unwrap_or(sequences.len())
}

#[cfg(test)]
mod tests {
    use aws_lambda_events::event::streams::{KinesisBatchItemFailure, KinesisEventResponse};

    use super::*;

    fn response(failed: &[&str]) -> KinesisEventResponse {
        let mut response = KinesisEventResponse::default();
        response.batch_item_failures = failed
            .iter()
            .map(|s| {
                let mut f = KinesisBatchItemFailure::default();
                f.item_identifier = Some(s.to_string());
                f
            })
            .collect();
        response
    }

    #[test]
    fn checkpoint_stops_before_the_first_failure() {
        let batch = ["1", "2", "3", "4"];
        assert_eq!(done_before_first_failure(&batch, &response(&[])), 4);
        assert_eq!(done_before_first_failure(&batch, &response(&["4", "2"])), 1);
        assert_eq!(done_before_first_failure(&batch, &response(&["1"])), 0);
        assert_eq!(done_before_first_failure(&batch, &response(&["9"])), 4);
    }
}
