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
use crate::readers::subscriptions::spec::{self, NewSubscription, ViewTarget};
use crate::readers::subscriptions::spec::{parse_start, Subscription};
use crate::readers::subscriptions::SubscriptionStatus;
use crate::readers::subscriptions::{self};
use crate::time::{format_ms, now_ms};
use crate::views::query::{self, Found, ViewQuery};
use crate::views::registry::{self, subscription_name, Building, Code, Definition, Kind, Registered};
use crate::views::table as views;
use crate::views::ViewEvent;
use crate::views::ViewRef;

/// How close to the complete end every partition of a version being built must be before
/// queries switch to it (its lag, as `subscription list` shows it).
pub const REBUILD_CAUGHT_UP: std::time::Duration = std::time::Duration::from_secs(30);
/// Events per batch a projection's partition folds at once (Kinesis' 500:
/// more events per transaction's position write, and more of a counter's adds summed).
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
    fn view_table(&self) -> Result<&str> {
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
            start_ms,
            building: None,
            created_at: format_ms(now),
        };
        let sub = version_subscription(&registered, 1, &registered.definition, now)?;
        registry::create(dynamo, views_table, &registered).await?;
        if let Err(err) = subscriptions::create(dynamo, &self.config.event_table, &sub).await {
            registry::remove(dynamo, views_table, &new.name).await?;
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

    /// Deletes a projection: each version's subscription first (no runner writes after), then its
    /// items, then its name.
    pub(crate) async fn delete_projection(&self, name: &str) -> Result<Value> {
        let (dynamo, views_table) = (&self.dynamo, self.view_table()?);
        let registered = registry::existing(dynamo, views_table, name).await?;
        let mut items = 0;
        for version in std::iter::once(registered.serving).chain(registered.building.as_ref().map(|b| b.version)) {
            items += self.drop_version(&registered, version).await?;
        }
        registry::remove(dynamo, views_table, name).await?;
        info!(projection = name, items, "projection deleted");
        Ok(json!({ "deleted": name, "items": items }))
    }

    /// Deletes one version: its subscription, then its items; the items deleted.
    async fn drop_version(&self, registered: &Registered, version: u32) -> Result<usize> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        let sub = subscription_name(&registered.name, version);
        if subscriptions::get(dynamo, table, &sub).await?.is_some() {
            subscriptions::delete(dynamo, table, &sub).await?;
        }
        registry::clear(dynamo, self.view_table()?, &registered.view(version)).await
    }

    /// Starts building the next version beside the serving one, from the projection's start, with
    /// `definition` (a changed one) or the serving one's; queries switch to it once it has caught up.
    pub(crate) async fn rebuild_projection(&self, name: &str, definition: Option<Definition>) -> Result<Value> {
        let (dynamo, views_table) = (&self.dynamo, self.view_table()?);
        let registered = registry::existing(dynamo, views_table, name).await?;
        if let Some(building) = &registered.building {
            return Err(Error::BadInput(format!(
                "projection {name:?} is building version {} already: cancel it first",
                building.version
            )));
        }
        let definition = definition.unwrap_or_else(|| registered.definition.clone());
        definition.select.check()?;
        spec::check_partitions(definition.partitions)?;
        if let Kind::Code(Code::Function { function }) = &definition.kind {
            target::check_function(&self.lambda, function).await?;
        }
        let version = registered.serving + 1;
        let now = now_ms();
        let building = Building { version, definition: definition.clone(), started_at: format_ms(now) };
        let next = Registered { building: Some(building), ..registered.clone() };
        let sub = version_subscription(&next, version, &definition, now)?;
        // What a crash between the writes below left of this version, cleared first.
        self.drop_version(&next, version).await?;
        if !registry::replace(dynamo, views_table, &registered, &next).await? {
            return Err(Error::BadInput(format!("projection {name:?} changed meanwhile: ask again")));
        }
        subscriptions::create(dynamo, &self.config.event_table, &sub).await?;
        info!(projection = name, version, "projection rebuild started");
        Ok(json!({ "rebuilding": name, "version": version, "subscription": sub.name }))
    }

    /// Stops a rebuild: the version being built is deleted; the serving one goes on.
    pub(crate) async fn cancel_rebuild(&self, name: &str) -> Result<Value> {
        let (dynamo, views_table) = (&self.dynamo, self.view_table()?);
        let registered = registry::existing(dynamo, views_table, name).await?;
        let Some(building) = registered.building.clone() else {
            return Err(Error::BadInput(format!("projection {name:?} is not being rebuilt")));
        };
        let next = Registered { building: None, ..registered.clone() };
        if !registry::replace(dynamo, views_table, &registered, &next).await? {
            return Err(Error::BadInput(format!("projection {name:?} changed meanwhile: ask again")));
        }
        let items = self.drop_version(&registered, building.version).await?;
        info!(projection = name, version = building.version, items, "projection rebuild cancelled");
        Ok(json!({ "cancelled": name, "version": building.version, "items": items }))
    }

    /// The tick's part: each version being built whose every partition is within
    /// [`REBUILD_CAUGHT_UP`] of the complete end becomes the serving one (one conditional
    /// write), and the version it replaces is deleted. The names of the projections switched.
    pub(crate) async fn switch_rebuilt(&self, statuses: &[SubscriptionStatus]) -> Result<Vec<String>> {
        let Some(views_table) = self.config.view_table.as_deref() else { return Ok(Vec::new()) };
        let bound = REBUILD_CAUGHT_UP.as_millis() as i64;
        let mut switched = Vec::new();
        for registered in registry::list(&self.dynamo, views_table).await? {
            let Some(building) = &registered.building else { continue };
            let sub = subscription_name(&registered.name, building.version);
            let caught_up = statuses.iter().find(|s| s.subscription.name == sub).is_some_and(|s| {
                s.partitions.len() == s.subscription.partitions as usize
                    && s.partitions.iter().all(|p| p.lag_ms.is_some_and(|lag| lag <= bound))
            });
            if !caught_up {
                continue;
            }
            let next = Registered {
                definition: building.definition.clone(),
                serving: building.version,
                building: None,
                ..registered.clone()
            };
            if !registry::replace(&self.dynamo, views_table, &registered, &next).await? {
                continue;
            }
            let items = self.drop_version(&registered, registered.serving).await?;
            info!(projection = %registered.name, version = building.version, old_items = items, "projection switched to its rebuilt version");
            switched.push(registered.name.clone());
        }
        Ok(switched)
    }

    /// One item of a projection's serving view, or a page of them, with the position the view reflects.
    pub(crate) async fn view(&self, query: ViewQuery) -> Result<Value> {
        match query::answer(&self.dynamo, self.view_table()?, &query).await? {
            Found::Answer(answer) => Ok(answer),
            Found::NoProjection => Err(Error::BadInput(format!("no projection {:?}", query.name))),
            Found::Behind(version) => Err(Error::BadInput(format!(
                "{:?} is at version {version:?}, not yet {:?}: ask again",
                query.key, query.at_least_version
            ))),
        }
    }
}

/// The subscription that keeps `version` of `registered` with `definition`.
fn version_subscription(
    registered: &Registered,
    version: u32,
    definition: &Definition,
    now: i64,
) -> Result<Subscription> {
    let subscription = NewSubscription {
        name: subscription_name(&registered.name, version),
        start: Some(registered.start_ms.to_string()),
        select: definition.select.clone(),
        partitions: Some(definition.partitions),
        batch_size: Some(PROJECTION_BATCH),
        ..NewSubscription::default()
    };
    let view = ViewRef { projection: registered.name.clone(), version, buckets: definition.partitions };
    subscription.for_view(ViewTarget { view, kind: definition.kind.clone() }, now)
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
}
