//! Managing subscriptions: one request type for the Lambda invocation
//! (`{"action": "create", ...}`) and the local CLI, one answer (JSON).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tracing::info;

use super::projections::NewProjection;
use super::target::{self, Attempt, DeliveredEvent, Delivery, Position};
use super::Subscriptions;
use crate::bookkeeping::slot_index::{read_index, SlotRef};
use crate::error::{Error, Result};
use crate::log::PlayedEvent;
use crate::log::Window;
use crate::readers::subscriptions::spec::{self, NewSubscription, State, Target};
use crate::readers::subscriptions::{self, Parked};
use crate::time::now_ms;
use crate::views::query::ViewQuery;
use crate::views::registry::Definition;

/// A management request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum Manage {
    /// A new subscription (see [`NewSubscription`]).
    Create(NewSubscription),
    /// Every subscription with its lag per partition.
    List,
    /// Runners stop at their next look (within a second, or after the batch in flight).
    Pause { name: String },
    /// Active again, and stopped partitions go on.
    Resume { name: String },
    /// Every partition delivers again from `to` (`beginning`, `now` or a time).
    Reset { name: String, to: String },
    /// A new partition count: the partitions stop, deliver up to a common
    /// position, and the new ones go on from it (each key in order).
    Rescale { name: String, partitions: u32 },
    /// The subscription, its checkpoints and its parked events are deleted.
    Delete { name: String },
    /// The parked events.
    Parked { name: String },
    /// Delivers parked events again (all, or those of `event_ids`), one at a
    /// time, and unparks those the target took.
    Redrive {
        name: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        event_ids: Vec<String>,
    },
    /// A new projection (see [`NewProjection`]): its view's version 1, and the subscription that keeps it.
    CreateProjection(NewProjection),
    /// Every projection, with where its partitions stand.
    Projections,
    /// The projection, its subscription and its view's items are deleted.
    DeleteProjection { name: String },
    /// One item of a projection's view (`key`), or a page of them in key order.
    View(ViewQuery),
    /// Builds the projection's next version from the log beside the serving one (with a new
    /// `definition`, or the same); queries switch to it once it has caught up.
    RebuildProjection {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        definition: Option<Definition>,
    },
    /// Stops a rebuild and deletes the version it was building.
    CancelRebuild { name: String },
}

impl Subscriptions {
    pub async fn manage(&self, request: Manage) -> Result<Value> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        self.ensure_time_unit().await?;
        let answer = match request {
            Manage::Create(new) => {
                let sub = new.validate(now_ms())?;
                match &sub.target {
                    Target::Kinesis(stream) => target::check_stream(&self.kinesis, stream).await?,
                    Target::Lambda(function) => target::check_function(&self.lambda, function).await?,
                    Target::View(_) => {} // refused by validate: a projection makes it
                }
                subscriptions::create(dynamo, table, &sub).await?;
                info!(subscription = %sub.name, target = %sub.target, partitions = sub.partitions, "subscription created");
                json!({ "created": sub })
            }
            Manage::List => {
                let (complete_end, subscriptions) = self.statuses().await?;
                json!({ "sealed_end": complete_end.map(crate::time::format_ms), "subscriptions": subscriptions })
            }
            Manage::Pause { name } => {
                subscriptions::set_state(dynamo, table, &name, State::Paused).await?;
                json!({ "paused": name })
            }
            Manage::Resume { name } => {
                subscriptions::set_state(dynamo, table, &name, State::Active).await?;
                subscriptions::unstop(dynamo, table, &subscriptions::existing(dynamo, table, &name).await?).await?;
                json!({ "resumed": name })
            }
            Manage::Reset { name, to } => {
                let sub = subscriptions::existing(dynamo, table, &name).await?;
                not_a_view(&sub.target, "reset")?;
                let to = spec::parse_start(&to, now_ms())?;
                subscriptions::reset(dynamo, table, &sub, to, self.config.time_unit_ms).await?;
                json!({ "reset": name, "to": crate::time::format_ms(to) })
            }
            Manage::Rescale { name, partitions } => {
                not_a_view(&subscriptions::existing(dynamo, table, &name).await?.target, "rescale")?;
                subscriptions::rescale(dynamo, table, &name, partitions).await?;
                info!(subscription = %name, partitions, "subscription rescale asked");
                json!({ "rescaling": name, "partitions": partitions })
            }
            Manage::Delete { name } => {
                if let Some(sub) = subscriptions::get(dynamo, table, &name).await? {
                    not_a_view(&sub.target, "delete")?;
                }
                subscriptions::delete(dynamo, table, &name).await?;
                json!({ "deleted": name })
            }
            Manage::Parked { name } => {
                let sub = subscriptions::existing(dynamo, table, &name).await?;
                json!({ "parked": subscriptions::parked(dynamo, table, &sub).await? })
            }
            Manage::Redrive { name, event_ids } => self.redeliver(&name, &event_ids).await?,
            Manage::CreateProjection(new) => self.create_projection(new).await?,
            Manage::Projections => self.projections().await?,
            Manage::DeleteProjection { name } => self.delete_projection(&name).await?,
            Manage::View(query) => self.view(query).await?,
            Manage::RebuildProjection { name, definition } => self.rebuild_projection(&name, definition).await?,
            Manage::CancelRebuild { name } => self.cancel_rebuild(&name).await?,
        };
        Ok(answer)
    }

    /// Delivers the parked events of `name` (all, or those named) once each.
    async fn redeliver(&self, name: &str, event_ids: &[String]) -> Result<Value> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        let sub = subscriptions::existing(dynamo, table, name).await?;
        let mut redelivered = Vec::new();
        let mut failed = Vec::new();
        for parked in subscriptions::parked(dynamo, table, &sub).await? {
            if !event_ids.is_empty() && !event_ids.contains(&parked.event_id) {
                continue;
            }
            let delivery = self.parked_delivery(&sub.name, &sub.target, &parked).await?;
            let attempt = match &sub.target {
                Target::Kinesis(stream) => {
                    let clients = (&self.putter, &self.kinesis);
                    let outcome = target::put_on_stream(
                        clients,
                        stream,
                        std::slice::from_ref(&delivery),
                        (sub.record_format, None),
                        &self.backoff,
                    )
                    .await;
                    match outcome.unavailable {
                        None => Attempt::Delivered,
                        Some(error) => Attempt::Unavailable(error),
                    }
                }
                Target::Lambda(function) => {
                    target::invoke(
                        &self.lambda,
                        function,
                        (&sub.name, parked.partition, None),
                        std::slice::from_ref(&delivery),
                    )
                    .await
                }
                Target::View(view) => {
                    self.apply_view(&sub.name, view, parked.partition, std::slice::from_ref(&delivery)).await
                }
            };
            match attempt {
                Attempt::Delivered => {
                    subscriptions::unpark(dynamo, table, name, &parked).await?;
                    redelivered.push(parked.event_id);
                }
                Attempt::FailedFrom(_, error) | Attempt::Unavailable(error) => {
                    failed.push(json!({ "event_id": parked.event_id, "error": error }));
                }
            }
        }
        info!(
            subscription = name,
            redelivered = redelivered.len(),
            failed = failed.len(),
            "parked events re-delivered"
        );
        Ok(json!({ "redriven": redelivered, "failed": failed }))
    }

    /// A parked event, read from the event table, as it is delivered.
    async fn parked_delivery(&self, name: &str, to: &Target, parked: &Parked) -> Result<Delivery> {
        let config = &self.config;
        let (slots, _) = read_index(&self.dynamo, &config.event_table, parked.slot, parked.slot + 1).await?;
        let slot = slots.into_iter().find(|s| s.slot == parked.slot).unwrap_or(SlotRef::single(parked.slot));
        let window = Window { start: parked.slot, end: parked.slot + config.time_unit_ms as i64 };
        let event = self
            .reader(&window, crate::slices::KeyRange::ALL)
            .event_at(slot, &parked.event_sort_key)
            .await?
            .ok_or_else(|| Error::Malformed(format!("parked event {} is not in the event table", parked.event_id)))?;
        let readable = self.tiers.bytes(&event).await?;
        let bytes = readable.bytes;
        let json = serde_json::from_slice(&bytes).ok();
        let delivered = DeliveredEvent {
            subscription: name.to_owned(),
            subscription_id: parked.sub_id.clone(),
            partition: parked.partition,
            position: Position { slot: event.slot, sort_key: event.sort_key.clone() },
            redriven: true,
            event: PlayedEvent::new(&event, json, &bytes, parked.seq),
        };
        // As the runner delivers it: a marker, not a record Kinesis would refuse on every re-delivery.
        let data = delivered.record(&event, to, readable.offloaded.as_ref())?;
        Ok(Delivery {
            seq: parked.seq,
            slot: event.slot,
            sort_key: event.sort_key,
            event_id: event.event_id,
            partition_key: event.partition_key,
            data,
        })
    }
}

/// A projection's subscription keeps its view exactly once from where it
/// stands: moving it (a reset, a rescale's new keys per partition) or
/// deleting it alone would break that.
fn not_a_view(target: &Target, action: &str) -> Result<()> {
    match target {
        Target::View(view) => Err(Error::BadInput(format!(
            "this subscription keeps projection {:?}: {action} the projection, not its subscription",
            view.view.projection
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_by_action_and_refuse_unknown_fields() {
        let create: Manage = serde_json::from_value(json!({
            "action": "create", "name": "orders", "start": "beginning", "target": {"kinesis": "out"}, "partitions": 8
        }))
        .unwrap();
        assert!(matches!(&create, Manage::Create(new) if new.partitions == Some(8) && new.name == "orders"));
        let reset: Manage = serde_json::from_value(json!({"action": "reset", "name": "a", "to": "now"})).unwrap();
        assert_eq!(reset, Manage::Reset { name: "a".into(), to: "now".into() });
        assert!(serde_json::from_value::<Manage>(json!({"action": "create", "name": "a", "typo": 1})).is_err());
        assert!(serde_json::from_value::<Manage>(json!({"action": "pause", "name": "a", "typo": 1})).is_err());
        assert!(serde_json::from_value::<Manage>(json!({"action": "explode"})).is_err());
        assert_eq!(serde_json::from_value::<Manage>(json!({"action": "list"})).unwrap(), Manage::List);
    }
}
