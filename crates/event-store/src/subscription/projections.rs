//! Projections, as the subscriptions function keeps them: a projection's
//! version is a subscription whose target is its view; a batch for it is
//! applied here (a built-in) or by the user's function (code), exactly once
//! either way ([`crate::views::table::apply`]). Creating, listing, deleting
//! and querying them are management actions.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tracing::info;

use super::target::{self, Attempt, Delivery};
use super::Subscriptions;
use crate::error::{Error, Result};
use crate::log::Select;
use crate::readers::subscriptions::spec::{parse_start, NewSubscription, Subscription, Target, ViewTarget};
use crate::readers::subscriptions::{self};
use crate::time::{format_ms, now_ms};
use crate::views::query::{self, Found, ViewQuery};
use crate::views::registry::{self, subscription_name, Code, Definition, Kind, Registered};
use crate::views::table as views;
use crate::views::ViewEvent;
use crate::views::ViewRef;

/// Events per batch a function projection's partition is sent (a subscription's Lambda batch);
/// a built-in one folds [`crate::views::BUILTIN_BATCH`].
pub const PROJECTION_BATCH: usize = 500;

/// `projection create`'s fields, as a user sends them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewProjection {
    pub name: String,
    /// `{"kind": "state", "fold": "merge"}`, `{"kind": "count", "by": "page"}`, `{"kind": "function", "function": "..."}`.
    #[serde(flatten)]
    pub kind: Kind,
    /// Entity-stream categories to fold (a `state` view's usual selection; joins `select`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub category: Vec<String>,
    #[serde(default, skip_serializing_if = "Select::is_empty")]
    pub select: Select,
    /// Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
    /// Where the view starts: `beginning` (the default: a read model of the whole log), `now`, or a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
}

impl Subscriptions {
    pub(super) fn view_table(&self) -> Result<&str> {
        self.config.view_table.as_deref().ok_or_else(|| {
            Error::Config("VIEW_TABLE is not set: this stack has no views table (deploy the current template)".into())
        })
    }

    /// Applies delivered events to a projection's view: here for a built-in,
    /// through the user's function for code.
    pub(crate) async fn apply_view(&self, sub: &str, to: &ViewTarget, partition: u32, events: &[Delivery]) -> Attempt {
        let builtin = match &to.kind {
            Kind::Code(Code::Function { function }) => {
                return target::invoke(&self.lambda, function, (sub, partition, Some(&to.view)), events).await;
            }
            Kind::Builtin(builtin) => builtin,
        };
        let table = match self.view_table() {
            Ok(table) => table,
            Err(err) => return Attempt::Unavailable(err.to_string()),
        };
        let parsed: std::result::Result<Vec<ViewEvent>, _> =
            events.iter().map(|e| serde_json::from_slice::<ViewEvent>(&e.data)).collect();
        let parsed = match parsed {
            Ok(parsed) => parsed,
            Err(err) => return Attempt::FailedFrom(0, format!("delivered event: {err}")),
        };
        match views::apply(&self.dynamo, table, (&to.view, partition), builtin, &parsed, &self.backoff).await {
            Ok(applied) => match applied.failed {
                None => Attempt::Delivered,
                Some(error) => Attempt::FailedFrom(applied.done, error),
            },
            Err(err) => Attempt::Unavailable(err.to_string()),
        }
    }

    /// Registers a projection and starts its version 1.
    pub(crate) async fn create_projection(&self, new: NewProjection) -> Result<Value> {
        let (dynamo, views_table) = (&self.dynamo, self.view_table()?);
        registry::check_name(&new.name)?;
        if let Kind::Code(Code::Function { function }) = &new.kind {
            target::check_function(&self.lambda, function).await?;
        }
        let mut select = new.select;
        select.categories.extend(new.category);
        let definition = Definition { kind: new.kind, select, partitions: new.partitions.unwrap_or(1) };
        let now = now_ms();
        let start_ms = parse_start(new.start.as_deref().unwrap_or("beginning"), now)?;
        let registered = Registered {
            name: new.name.clone(),
            definition,
            serving: 1,
            instance: Some(registry::new_instance()),
            start_ms,
            building: None,
            created_at: format_ms(now),
        };
        let sub = version_subscription(&registered.view(1), &registered, &registered.definition, now)?;
        registry::create(dynamo, views_table, &registered).await?;
        if let Err(err) = subscriptions::create(dynamo, &self.config.event_table, &sub).await {
            registry::remove(dynamo, views_table, &new.name, Some(&registered)).await?;
            return Err(err);
        }
        info!(projection = %new.name, subscription = %sub.name, partitions = sub.partitions, "projection created");
        Ok(json!({ "created": registered, "subscription": sub.name }))
    }

    /// Every projection, with where its serving version's partitions stand.
    pub(crate) async fn projections(&self) -> Result<Value> {
        let (dynamo, views_table) = (&self.dynamo, self.view_table()?);
        let mut out = Vec::new();
        for registered in registry::list(dynamo, views_table).await? {
            let position = query::position(dynamo, views_table, &registered).await?;
            out.push(json!({ "projection": registered, "position": position }));
        }
        Ok(json!({ "projections": out }))
    }

    /// Deletes a projection: its name first (only while no rebuild started, switched or ended
    /// meanwhile), then each version's subscription (no runner writes after) and items.
    pub(crate) async fn delete_projection(&self, name: &str) -> Result<Value> {
        let (dynamo, views_table) = (&self.dynamo, self.view_table()?);
        let registered = registry::existing(dynamo, views_table, name).await?;
        if !registry::remove(dynamo, views_table, name, Some(&registered)).await? {
            return Err(Error::BadInput(format!("projection {name:?} changed meanwhile: ask again")));
        }
        let mut items = 0;
        for view in registered.views() {
            items += self.drop_version(&view).await?;
        }
        info!(projection = name, items, "projection deleted");
        Ok(json!({ "deleted": name, "items": items }))
    }

    /// Deletes one version: its subscription (only if it keeps this very view), then its items;
    /// the items deleted. A runner in flight may still write its batch after: under this version's
    /// own keys (its instance's), which nothing reads again.
    pub(super) async fn drop_version(&self, view: &ViewRef) -> Result<usize> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        let sub = subscription_name(&view.projection, view.version);
        let keeps = |s: &Subscription| matches!(&s.target, Target::View(t) if &t.view == view);
        if subscriptions::get(dynamo, table, &sub).await?.is_some_and(|s| keeps(&s)) {
            subscriptions::delete(dynamo, table, &sub).await?;
        }
        registry::clear(dynamo, self.view_table()?, view).await
    }

    /// One item of a projection's serving view, or a page of them, with the position the view reflects.
    pub(crate) async fn view(&self, query: ViewQuery) -> Result<Value> {
        match query::answer(&self.dynamo, self.view_table()?, &query).await? {
            Found::Answer(answer) => Ok(answer),
            Found::NoProjection => Err(Error::BadInput(format!("no projection {:?}", query.name))),
            Found::Forgotten(marker) => Ok(json!({ "projection": query.name, "key": query.key, "forgotten": marker })),
            Found::Behind(version) => Err(Error::BadInput(format!(
                "{:?} is at version {version:?}, not yet {:?}: ask again",
                query.key, query.at_least_version
            ))),
        }
    }
}

/// The subscription that keeps `view`, a version of `registered` with `definition`.
pub(super) fn version_subscription(
    view: &ViewRef,
    registered: &Registered,
    definition: &Definition,
    now: i64,
) -> Result<Subscription> {
    let subscription = NewSubscription {
        name: subscription_name(&registered.name, view.version),
        start: Some(registered.start_ms.to_string()),
        select: definition.select.clone(),
        partitions: Some(definition.partitions),
        batch_size: Some(match definition.kind {
            Kind::Builtin(_) => crate::views::BUILTIN_BATCH,
            Kind::Code(_) => PROJECTION_BATCH,
        }),
        ..NewSubscription::default()
    };
    subscription.for_view(ViewTarget { view: view.clone(), kind: definition.kind.clone() }, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::builtin::{Builtin, By, Fold};

    #[test]
    fn new_projections_read_as_the_cli_sends_them() {
        let state: NewProjection =
            serde_json::from_value(json!({"name": "todos", "kind": "state", "category": ["todo"]})).unwrap();
        assert_eq!(state.kind, Kind::Builtin(Builtin::State { fold: Fold::Merge }));
        assert_eq!(state.category, vec!["todo".to_string()]);
        let count: NewProjection =
            serde_json::from_value(json!({"name": "pages", "kind": "count", "by": "page", "partitions": 4})).unwrap();
        assert_eq!((count.kind, count.partitions), (Kind::Builtin(Builtin::Count { by: By::Page }), Some(4)));
        let code: NewProjection =
            serde_json::from_value(json!({"name": "t", "kind": "function", "function": "event-store-dev-sub-todos"}))
                .unwrap();
        assert!(matches!(code.kind, Kind::Code(Code::Function { .. })));
        assert!(serde_json::from_value::<NewProjection>(json!({"name": "x", "kind": "count"})).is_err());
    }

    #[test]
    fn a_builtin_projection_folds_larger_batches_than_a_function_is_sent() {
        let view = ViewRef { projection: "p".into(), version: 1, buckets: 2, instance: Some("i".into()) };
        let batch_of = |kind: Kind| {
            let definition = Definition { kind, select: Default::default(), partitions: 2 };
            let registered = Registered {
                name: "p".into(),
                definition: definition.clone(),
                serving: 1,
                instance: Some("i".into()),
                start_ms: 0,
                building: None,
                created_at: String::new(),
            };
            version_subscription(&view, &registered, &definition, 1_000).map(|s| s.batch_size)
        };
        assert_eq!(batch_of(Kind::Builtin(Builtin::Count { by: By::Type })).unwrap(), crate::views::BUILTIN_BATCH);
        let function = Kind::Code(Code::Function { function: "f".into() });
        assert_eq!(batch_of(function).unwrap(), PROJECTION_BATCH);
        // A subscription with any other target is still refused a batch over 500.
        let target = Some(Target::Kinesis("arn".into()));
        let plain = NewSubscription { name: "s".into(), target, batch_size: Some(501), ..NewSubscription::default() };
        let refused = plain.validate(1_000).unwrap_err().to_string();
        assert!(refused.contains("1 to 500"), "{refused}");
    }
}
