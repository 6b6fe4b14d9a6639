//! `event-store projection <action>` and `event-store view`: projections
//! (read models kept from the log, docs/projections.md) through the
//! subscriptions function's management actions, as `subscription` does.

use anyhow::Result;
use clap::Subcommand;
use event_store::subscription::projections::NewProjection;
use event_store::subscription::Manage;
use event_store::views::builtin::{Builtin, By, Fold};
use event_store::views::query::ViewQuery;
use event_store::views::registry::{Code, Definition, Kind};

use crate::select::SelectArgs;

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once from the command line, as `subscription`'s
pub enum Action {
    /// Create a projection: its view kept from START on, exactly once.
    Create {
        name: String,
        /// `state` (each entity stream's state), `count` (events per key per minute, hour and day)
        /// or `function` (your code: --function).
        #[arg(long)]
        kind: String,
        /// `state`: `merge` (each event's data a JSON merge patch, RFC 7386) or `replace`.
        #[arg(long, default_value = "merge")]
        fold: String,
        /// `count`: `page`, `referrer_host`, `type` or `entity`.
        #[arg(long)]
        by: Option<String>,
        /// `function`: the Lambda function that applies each batch (named <service>-<stage>-sub-*).
        #[arg(long)]
        function: Option<String>,
        /// Partitions (1 to 1024): runners in parallel, each key's events in one of them.
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// `beginning`, `now`, or a time (ISO 8601 or epoch ms).
        #[arg(long, default_value = "beginning")]
        start: String,
        #[command(flatten)]
        select: SelectArgs,
    },
    /// Build the next version from the log beside the serving one (a new definition: --kind and
    /// its options; else the same), switched to once caught up; the serving one answers meanwhile.
    Rebuild {
        name: String,
        #[arg(long)]
        kind: Option<String>,
        #[arg(long, default_value = "merge")]
        fold: String,
        #[arg(long)]
        by: Option<String>,
        #[arg(long)]
        function: Option<String>,
        /// Default 1, with --kind.
        #[arg(long)]
        partitions: Option<u32>,
        #[command(flatten)]
        select: SelectArgs,
    },
    /// Stop a rebuild: the version being built is deleted.
    CancelRebuild { name: String },
    /// Every projection, with where its partitions stand.
    List,
    /// Delete a projection: its subscription, then its view's items.
    Delete { name: String },
}

fn word<T: serde::de::DeserializeOwned>(what: &str, value: &str) -> Result<T> {
    serde_json::from_value(serde_json::Value::String(value.to_owned()))
        .map_err(|_| anyhow::anyhow!("--{what} {value:?} is not one this store knows"))
}

impl Action {
    /// The request the subscriptions function takes; bad arguments are refused here.
    pub fn request(self) -> Result<Manage> {
        Ok(match self {
            Action::Create { name, kind, fold, by, function, partitions, start, select } => {
                let kind = kind_of(&kind, &fold, by, function)?;
                event_store::readers::subscriptions::spec::check_partitions(partitions)?;
                Manage::CreateProjection(NewProjection {
                    name,
                    kind,
                    category: Vec::new(),
                    select: select.select()?,
                    partitions: Some(partitions),
                    start: Some(start),
                })
            }
            Action::Rebuild { name, kind, fold, by, function, partitions, select } => {
                let select = select.select()?;
                let definition = match kind {
                    Some(kind) => Some(Definition {
                        kind: kind_of(&kind, &fold, by, function)?,
                        select,
                        partitions: event_store::readers::subscriptions::spec::check_partitions(
                            partitions.unwrap_or(1),
                        )?,
                    }),
                    None if by.is_some() || function.is_some() || partitions.is_some() || !select.is_empty() => {
                        anyhow::bail!("a new definition starts with --kind (and gives all of it)")
                    }
                    None => None,
                };
                Manage::RebuildProjection { name, definition }
            }
            Action::CancelRebuild { name } => Manage::CancelRebuild { name },
            Action::List => Manage::Projections,
            Action::Delete { name } => Manage::DeleteProjection { name },
        })
    }
}

/// `--kind` with its own options: `state --fold`, `count --by`, `function --function`.
fn kind_of(kind: &str, fold: &str, by: Option<String>, function: Option<String>) -> Result<Kind> {
    Ok(match (kind, by, function) {
        ("state", None, None) => Kind::Builtin(Builtin::State { fold: word::<Fold>("fold", fold)? }),
        ("count", Some(by), None) => Kind::Builtin(Builtin::Count { by: word::<By>("by", &by)? }),
        ("function", None, Some(function)) => Kind::Code(Code::Function { function }),
        ("state" | "count" | "function", _, _) => {
            anyhow::bail!("--kind state takes --fold, count takes --by, function takes --function (and only those)")
        }
        (other, _, _) => anyhow::bail!("--kind {other:?}: state, count or function"),
    })
}

/// `event-store view NAME [KEY]`'s arguments.
#[derive(clap::Args)]
pub struct ViewArgs {
    /// The projection.
    name: String,
    /// One item; without it, a page of items in key order.
    key: Option<String>,
    /// Only keys that start with this (`day/2026-11-29/` for a count view's day).
    #[arg(long)]
    prefix: Option<String>,
    /// Keys after this one (the `next` of the page before).
    #[arg(long)]
    after: Option<String>,
    /// Items per page (1 to 1000; default 100).
    #[arg(long)]
    limit: Option<usize>,
    /// With KEY, of a state view: wait (a few seconds at most) until its stream is at this version.
    #[arg(long)]
    at_least_version: Option<u64>,
}

impl ViewArgs {
    pub fn request(self) -> Result<Manage> {
        if self.key.is_some() && (self.prefix.is_some() || self.after.is_some() || self.limit.is_some()) {
            anyhow::bail!("a KEY names one item: --prefix, --after and --limit are for pages");
        }
        if self.key.is_none() && self.at_least_version.is_some() {
            anyhow::bail!("--at-least-version waits for one item: name its KEY");
        }
        Ok(Manage::View(ViewQuery {
            name: self.name,
            key: self.key,
            prefix: self.prefix,
            after: self.after,
            limit: self.limit,
            at_least_version: self.at_least_version,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(kind: &str, by: Option<&str>, function: Option<&str>) -> Result<Manage> {
        Action::Create {
            name: "pages".into(),
            kind: kind.into(),
            fold: "merge".into(),
            by: by.map(str::to_owned),
            function: function.map(str::to_owned),
            partitions: 2,
            start: "beginning".into(),
            select: SelectArgs::default(),
        }
        .request()
    }

    #[test]
    fn create_takes_each_kinds_own_options_only() {
        let Manage::CreateProjection(count) = create("count", Some("page"), None).unwrap() else { panic!() };
        assert_eq!(count.kind, Kind::Builtin(Builtin::Count { by: By::Page }));
        assert!(matches!(create("state", None, None).unwrap(), Manage::CreateProjection(p) if p.partitions == Some(2)));
        assert!(create("count", None, None).is_err(), "count needs --by");
        assert!(create("count", Some("colour"), None).is_err());
        assert!(create("state", Some("page"), None).is_err());
        assert!(create("function", None, Some("event-store-dev-sub-todos")).is_ok());
        assert!(create("sum", None, None).is_err());
    }
}
