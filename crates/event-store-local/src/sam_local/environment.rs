//! The environment `sam local` passes each function (`--env-vars`): what it declares, as the local stack sets it.

use serde_json::Value;

use super::template::{LocalTemplate, KEY_FUNCTION};

/// `--env-vars` content: for each function, each variable it declares that
/// `lookup` (this process's environment, as the local stack sets it) has a
/// non-empty value for, and `AWS_ENDPOINT_URL = endpoint`: SAM ranks this file
/// over the shell (which holds the emulator's address on the host) and the template.
pub fn env_vars(template: &LocalTemplate, endpoint: &str, lookup: impl Fn(&str) -> Option<String>) -> Value {
    let functions = template.functions.iter().map(|function| {
        let mut values: serde_json::Map<String, Value> = function
            .variables
            .iter()
            .filter_map(|name| lookup(name).filter(|v| !v.trim().is_empty()).map(|v| (name.clone(), Value::String(v))))
            .collect();
        values.insert("AWS_ENDPOINT_URL".into(), endpoint.into());
        if function.variables.iter().any(|v| v == KEY_FUNCTION) {
            // Set, and empty (as unset to the function): else SAM would pass the template's !Ref on.
            values.insert(KEY_FUNCTION.into(), "".into());
        }
        (function.logical_id.clone(), Value::Object(values))
    });
    Value::Object(functions.collect())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;
    use serde_yaml::Value as Yaml;

    use super::super::template::local_template;
    use super::*;

    fn template() -> String {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml")).unwrap()
    }

    #[test]
    fn env_vars_carry_declared_non_empty_values_and_the_containers_endpoint() {
        let local = local_template(&template(), Path::new("/x")).unwrap();
        let vars = env_vars(&local, "http://h:1", |name| match name {
            "EVENT_STREAM" => Some("s".into()),
            "AWS_ENDPOINT_URL" => Some("http://127.0.0.1:4566".into()),
            "DYNAMO_EVENT_TABLE" => Some("t".into()),
            "IP_MODE" => Some(String::new()), // as make exports an unset variable
            _ => None,
        });
        // The load function does not declare the event table; the pump does not declare the stream.
        assert_eq!(
            vars["LoadFunction"],
            json!({ "EVENT_STREAM": "s", "AWS_ENDPOINT_URL": "http://h:1", "KEY_FUNCTION": "" })
        );
        assert_eq!(vars["PumpFunction"], json!({ "DYNAMO_EVENT_TABLE": "t", "AWS_ENDPOINT_URL": "http://h:1" }));
    }

    #[test]
    fn local_writers_make_subjects_keys_themselves_under_the_local_kms_key() {
        let local = local_template(&template(), Path::new("/x")).unwrap();
        let vars = env_vars(&local, "http://h:1", |name| match name {
            "KEY_TABLE" => Some("keys".into()),
            "SUBJECT_KMS_KEY" => Some("alias/local".into()),
            _ => None,
        });
        for writer in ["LoadFunction", "StreamsFunction"] {
            // The stack's keys function is not there: an empty KEY_FUNCTION, and the local KMS key.
            assert_eq!(vars[writer]["KEY_FUNCTION"], json!(""), "{writer}");
            assert_eq!(vars[writer]["SUBJECT_KMS_KEY"], json!("alias/local"), "{writer}");
        }
        assert_eq!(vars["KeysFunction"]["SUBJECT_KMS_KEY"], json!("alias/local"));
        assert!(vars["PlaybackFunction"].get("SUBJECT_KMS_KEY").is_none(), "a reader makes no key");
        let rendered: Yaml = serde_yaml::from_str(&local.render("http://h:1").unwrap()).unwrap();
        assert!(rendered["Globals"]["Function"]["Environment"]["Variables"].get("SUBJECT_KMS_KEY").is_some());
    }
}
