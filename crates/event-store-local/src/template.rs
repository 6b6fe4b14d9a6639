//! What template.yaml configures, read from it, so that the local stack runs
//! exactly that: each function's environment as CloudFormation resolves it
//! with the parameters' defaults, the schedules' rates, and how the pump's
//! event source mapping batches. Resource names come from
//! [`event_store_emulator::resources::Names`] instead (they are `!Sub`s and
//! `!Ref`s to resources).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_yaml::Value;

pub struct Template(Value);

/// A schedule of the template, by the function it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduled {
    Scan,
    Subscriptions,
    Archive,
}

impl Scheduled {
    fn function(self) -> &'static str {
        match self {
            Self::Scan => "ScanFunction",
            Self::Subscriptions => "SubscriptionsFunction",
            Self::Archive => "ArchiveFunction",
        }
    }
}

impl Template {
    /// The project's template, as built into this binary.
    pub fn project() -> Result<Self> {
        Self::parse(include_str!("../../../template.yaml"))
    }

    pub fn parse(text: &str) -> Result<Self> {
        Ok(Self(serde_yaml::from_str(text).context("template.yaml is not YAML")?))
    }

    /// A parameter's default, as the string a function's environment gets.
    pub fn parameter_default(&self, name: &str) -> Option<String> {
        scalar(&self.0["Parameters"][name]["Default"])
    }

    /// Every function's variables that the template sets to a literal or to
    /// a parameter (`!Ref`) with a non-empty default: name → value. The same
    /// variable is given the same value by every function (an error otherwise:
    /// the local stack has one environment for all of them).
    pub fn function_defaults(&self) -> Result<BTreeMap<String, String>> {
        let mut out: BTreeMap<String, (String, String)> = BTreeMap::new();
        let resources = self.0["Resources"].as_mapping().context("template.yaml has no Resources")?;
        for (id, resource) in resources {
            if resource["Type"].as_str() != Some("AWS::Serverless::Function") {
                continue;
            }
            let id = id.as_str().unwrap_or_default();
            let Some(variables) = resource["Properties"]["Environment"]["Variables"].as_mapping() else { continue };
            for (name, value) in variables {
                let Some(name) = name.as_str() else { continue };
                let value = match value {
                    Value::Tagged(tagged) if tagged.tag == "!Ref" => {
                        tagged.value.as_str().and_then(|parameter| self.parameter_default(parameter))
                    }
                    Value::Tagged(_) => None,
                    other => scalar(other),
                };
                let Some(value) = value.filter(|v| !v.is_empty()) else { continue };
                if let Some((first, seen)) = out.get(name) {
                    if *seen != value {
                        bail!("{name} is {seen:?} for {first} but {value:?} for {id}: the local stack has one environment");
                    }
                    continue;
                }
                out.insert(name.to_owned(), (id.to_owned(), value));
            }
        }
        Ok(out.into_iter().map(|(name, (_, value))| (name, value)).collect())
    }

    /// The rate of the schedule that starts `function` (its `Schedule` event).
    pub fn rate(&self, scheduled: Scheduled) -> Result<Duration> {
        let function = scheduled.function();
        let schedule = &self.0["Resources"][function]["Properties"]["Events"]["Schedule"]["Properties"]["Schedule"];
        let expression = match schedule {
            Value::Tagged(tagged) if tagged.tag == "!Ref" => {
                tagged.value.as_str().and_then(|parameter| self.parameter_default(parameter))
            }
            other => scalar(other),
        };
        let expression = expression.with_context(|| format!("{function} has no schedule"))?;
        parse_rate(&expression).with_context(|| format!("{function}'s schedule {expression:?}"))
    }

    /// The pump's event source mapping: (`BatchSize`, `MaximumBatchingWindowInSeconds`).
    pub fn pump_batching(&self) -> Result<(usize, Duration)> {
        let mapping = &self.0["Resources"]["PumpEventSource"]["Properties"];
        let size = match &mapping["BatchSize"] {
            Value::Tagged(tagged) if tagged.tag == "!Ref" => {
                tagged.value.as_str().and_then(|parameter| self.parameter_default(parameter))
            }
            other => scalar(other),
        };
        let size = size.and_then(|s| s.parse().ok()).context("the pump's BatchSize")?;
        let window = mapping["MaximumBatchingWindowInSeconds"].as_u64().unwrap_or(0);
        Ok((size, Duration::from_secs(window)))
    }

    /// The HTTP API's CORS settings (`CorsConfiguration`), which API Gateway answers with in AWS.
    pub fn cors(&self) -> Result<Cors> {
        let cors = &self.0["Resources"]["HttpApi"]["Properties"]["CorsConfiguration"];
        let list = |name: &str| -> Result<String> {
            let items = cors[name].as_sequence().with_context(|| format!("CorsConfiguration.{name}"))?;
            Ok(items.iter().filter_map(scalar).collect::<Vec<_>>().join(", "))
        };
        Ok(Cors {
            allow_origins: list("AllowOrigins")?,
            allow_methods: list("AllowMethods")?,
            allow_headers: list("AllowHeaders")?,
            expose_headers: list("ExposeHeaders")?,
            max_age: scalar(&cors["MaxAge"]).context("CorsConfiguration.MaxAge")?,
        })
    }
}

/// CORS as the template's HTTP API answers it: header values, comma-separated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    pub allow_origins: String,
    pub allow_methods: String,
    pub allow_headers: String,
    pub expose_headers: String,
    pub max_age: String,
}

fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// An EventBridge rate expression (`rate(1 minute)`, `rate(5 minutes)`, `rate(1 hour)`, `rate(2 days)`).
pub fn parse_rate(expression: &str) -> Result<Duration> {
    let inner = expression
        .trim()
        .strip_prefix("rate(")
        .and_then(|rest| rest.strip_suffix(')'))
        .context("not a rate expression: rate(<value> <unit>)")?;
    let (value, unit) = inner.trim().split_once(' ').context("rate(<value> <unit>)")?;
    let value: u64 = value.parse().ok().filter(|v| *v > 0).context("the value is not a positive integer")?;
    let seconds = match (value, unit.trim()) {
        (1, "minute") | (2.., "minutes") => 60,
        (1, "hour") | (2.., "hours") => 3_600,
        (1, "day") | (2.., "days") => 86_400,
        (_, unit) => bail!("unit {unit:?} does not go with {value} (minute, minutes, hour, hours, day, days)"),
    };
    Ok(Duration::from_secs(value * seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cors_is_read_from_the_http_api() {
        let cors = Template::project().unwrap().cors().unwrap();
        assert_eq!(cors.allow_origins, "*");
        assert!(cors.expose_headers.split(", ").any(|h| h == "retry-after"), "{cors:?}");
        assert!(cors.allow_methods.contains("POST") && cors.allow_headers.contains("content-type"), "{cors:?}");
    }

    #[test]
    fn rate_expressions_parse_as_eventbridge_reads_them() {
        assert_eq!(parse_rate("rate(1 minute)").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_rate("rate(5 minutes)").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_rate("rate(1 hour)").unwrap(), Duration::from_secs(3_600));
        assert_eq!(parse_rate("rate(2 days)").unwrap(), Duration::from_secs(172_800));
        for bad in ["rate(1 minutes)", "rate(2 minute)", "rate(0 hours)", "cron(0 * * * ? *)", "rate(1 week)"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_function_s_variables_resolve_parameters_to_their_defaults_and_must_agree() {
        let template = Template::parse(
            "Parameters:\n  Segments: {Type: Number, Default: 4}\n  Empty: {Type: String, Default: ''}\n\
             Resources:\n  A:\n    Type: AWS::Serverless::Function\n    Properties:\n      Environment:\n        Variables:\n\
             \x20         SEGMENTS: !Ref Segments\n          LITERAL: x\n          EMPTY: !Ref Empty\n          NAME: !Sub '${AWS::Region}'\n\
             \x20 B:\n    Type: AWS::Serverless::Function\n    Properties:\n      Environment:\n        Variables:\n          SEGMENTS: !Ref Segments\n",
        )
        .unwrap();
        let defaults = template.function_defaults().unwrap();
        assert_eq!(defaults, BTreeMap::from([("SEGMENTS".into(), "4".into()), ("LITERAL".into(), "x".into())]));
        let disagreeing = Template::parse(
            "Resources:\n  A:\n    Type: AWS::Serverless::Function\n    Properties:\n      Environment:\n        Variables:\n          X: '1'\n\
             \x20 B:\n    Type: AWS::Serverless::Function\n    Properties:\n      Environment:\n        Variables:\n          X: '2'\n",
        )
        .unwrap();
        assert!(disagreeing.function_defaults().is_err());
    }
}
