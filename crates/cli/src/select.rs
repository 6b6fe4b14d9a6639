//! What `playback` and `subscription create` select by fields in the clear, as command-line arguments.

use anyhow::Result;
use event_store::log::Select;

#[derive(clap::Args, Clone, Default)]
pub struct SelectArgs {
    /// Only events of these types (an entity event's `type`, a posted event's `type`). Repeatable.
    #[arg(long = "type", value_delimiter = ',')]
    types: Vec<String>,
    /// Only entity events of streams of these categories (`todo` for `todo-42`). Repeatable.
    #[arg(long = "category", value_delimiter = ',')]
    categories: Vec<String>,
    /// Only entity events of streams whose name starts with this.
    #[arg(long)]
    stream_prefix: Option<String>,
    /// Only events from `pixel`, `post` or `stream` (entity appends). Repeatable.
    #[arg(long = "source", value_delimiter = ',')]
    sources: Vec<String>,
}

impl SelectArgs {
    /// The selection, checked by the store's own rules.
    pub fn select(self) -> Result<Select> {
        let select = Select {
            types: self.types,
            categories: self.categories,
            stream_prefix: self.stream_prefix,
            sources: self.sources.iter().map(|s| s.parse()).collect::<event_store::Result<Vec<_>>>()?,
        };
        select.check()?;
        Ok(select)
    }
}

#[cfg(test)]
impl SelectArgs {
    pub fn categories(categories: &[&str], sources: &[&str]) -> Self {
        let owned = |list: &[&str]| list.iter().map(|s| s.to_string()).collect();
        Self { categories: owned(categories), sources: owned(sources), ..Self::default() }
    }
}
