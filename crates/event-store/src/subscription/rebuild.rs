//! A projection rebuilt without downtime: the next version built beside the
//! serving one, as a subscription of its own from the projection's start,
//! and switched to by the tick in one conditional write of the registry once
//! it has caught up. The tick also tends what a crash or a race left: a
//! version being built whose subscription was never made is started, and a
//! view subscription the registry no longer names is deleted with its items.

use serde_json::{json, Value};
use tracing::{info, warn};

use super::projections::version_subscription;
use super::target;
use super::Subscriptions;
use crate::error::{Error, Result};
use crate::readers::subscriptions::spec::{self, Target};
use crate::readers::subscriptions::{self, SubscriptionStatus};
use crate::time::{format_ms, now_ms};
use crate::views::registry::{self, Building, Code, Definition, Kind, Registered};

/// How close to the complete end every partition of a version being built must be before
/// queries switch to it (its lag, as `subscription list` shows it).
pub const REBUILD_CAUGHT_UP: std::time::Duration = std::time::Duration::from_secs(30);

impl Subscriptions {
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
        let instance = Some(registry::new_instance());
        let building = Building { version, instance, definition: definition.clone(), started_at: format_ms(now) };
        let next = Registered { building: Some(building), ..registered.clone() };
        let sub = version_subscription(&next.view(version), &next, &definition, now)?;
        if !registry::replace(dynamo, views_table, &registered, &next).await? {
            return Err(Error::BadInput(format!("projection {name:?} changed meanwhile: ask again")));
        }
        // A crash here leaves the version registered without its subscription: the tick makes it.
        self.start_version(&sub).await?;
        info!(projection = name, version, "projection rebuild started");
        Ok(json!({ "rebuilding": name, "version": version, "subscription": sub.name }))
    }

    /// Creates a version's subscription (unless it exists, keeping this very view), in place of
    /// one an earlier instance of that number left, which is dropped only if the registry, read
    /// again, no longer names it (another rebuild may have made it meanwhile).
    async fn start_version(&self, sub: &spec::Subscription) -> Result<()> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        let Target::View(new) = &sub.target else { return Ok(()) };
        if let Some(old) = subscriptions::get(dynamo, table, &sub.name).await? {
            let Target::View(old) = &old.target else {
                return Err(Error::BadInput(format!("subscription {:?} is not a projection's", sub.name)));
            };
            if old.view == new.view {
                return Ok(());
            }
            let named = registry::get(dynamo, self.view_table()?, &new.view.projection).await?;
            if named.is_some_and(|r| r.views().contains(&old.view)) {
                return Err(Error::BadInput(format!("{:?} keeps a version its projection still names", sub.name)));
            }
            self.drop_version(&old.view).await?;
        }
        subscriptions::create(dynamo, table, sub).await
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
        let items = self.drop_version(&registered.view(building.version)).await?;
        info!(projection = name, version = building.version, items, "projection rebuild cancelled");
        Ok(json!({ "cancelled": name, "version": building.version, "items": items }))
    }

    /// The tick's part, which never fails the tick (what it could not do, it logs and does next
    /// time): each version being built whose every partition is within [`REBUILD_CAUGHT_UP`] of
    /// the complete end becomes the serving one (one conditional write), and the version it
    /// replaces is deleted; a version being built without its subscription gets it; a view
    /// subscription no projection names any more goes, with its items. The projections switched.
    pub(crate) async fn tend_projections(&self, statuses: &[SubscriptionStatus]) -> Vec<String> {
        match self.tend(statuses).await {
            Ok(switched) => switched,
            Err(err) => {
                warn!(error = %err, "projections not tended: the next tick tries again");
                Vec::new()
            }
        }
    }

    async fn tend(&self, statuses: &[SubscriptionStatus]) -> Result<Vec<String>> {
        let Some(views_table) = self.config.view_table.as_deref() else { return Ok(Vec::new()) };
        let registry = registry::list(&self.dynamo, views_table).await?;
        let mut switched = Vec::new();
        for registered in &registry {
            // One projection's trouble is logged, and the others are tended.
            match self.tend_one(registered, statuses, views_table).await {
                Ok(true) => switched.push(registered.name.clone()),
                Ok(false) => {}
                Err(err) => {
                    warn!(projection = %registered.name, error = %err, "projection not tended: the next tick tries again")
                }
            }
        }
        // View subscriptions of versions no projection names: a dropped version's leftovers.
        for status in statuses {
            let Target::View(target) = &status.subscription.target else { continue };
            let named = registry.iter().any(|r| r.name == target.view.projection && r.views().contains(&target.view));
            // Registered after the list was read (a create or rebuild meanwhile) is named next time.
            let young = status.subscription.created_at >= format_ms(now_ms() - 60_000);
            if !named && !young && !switched.contains(&target.view.projection) {
                match self.drop_version(&target.view).await {
                    Ok(items) => {
                        warn!(subscription = %status.subscription.name, items, "a view no projection names: deleted")
                    }
                    Err(err) => {
                        warn!(subscription = %status.subscription.name, error = %err, "a view no projection names: not deleted yet")
                    }
                }
            }
        }
        Ok(switched)
    }

    /// One projection's rebuild looked at: resumed if its subscription is missing (the registry read
    /// again first), switched to if caught up. `true` when queries now read the rebuilt version.
    async fn tend_one(
        &self,
        registered: &Registered,
        statuses: &[SubscriptionStatus],
        views_table: &str,
    ) -> Result<bool> {
        let Some(building) = &registered.building else { return Ok(false) };
        let view = registered.view(building.version);
        let status = statuses.iter().find(|s| matches!(&s.subscription.target, Target::View(t) if t.view == view));
        let Some(status) = status else {
            let now = registry::get(&self.dynamo, views_table, &registered.name).await?;
            if now.as_ref() == Some(registered) {
                let sub = version_subscription(&view, registered, &building.definition, now_ms())?;
                self.start_version(&sub).await?;
                info!(projection = %registered.name, version = building.version, "rebuild resumed: its subscription made");
            }
            return Ok(false);
        };
        let bound = REBUILD_CAUGHT_UP.as_millis() as i64;
        let caught_up = status.partitions.len() == status.subscription.partitions as usize
            && status.partitions.iter().all(|p| p.lag_ms.is_some_and(|lag| lag <= bound));
        if !caught_up {
            return Ok(false);
        }
        let next = Registered {
            definition: building.definition.clone(),
            serving: building.version,
            instance: building.instance.clone(),
            building: None,
            ..registered.clone()
        };
        if !registry::replace(&self.dynamo, views_table, registered, &next).await? {
            return Ok(false);
        }
        info!(projection = %registered.name, version = building.version, "projection switched to its rebuilt version");
        // Switched: the old version's removal, if it fails, is the orphan sweep's of a later tick.
        match self.drop_version(&registered.view(registered.serving)).await {
            Ok(items) => info!(projection = %registered.name, old_items = items, "the version it replaced deleted"),
            Err(err) => warn!(projection = %registered.name, error = %err, "the version it replaced not deleted yet"),
        }
        Ok(true)
    }
}
