//! The template as `sam local` sees it: code paths made absolute, the endpoint declared, what each function declares.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_yaml::Value as Yaml;

/// The template as `sam local` should see it locally: every `CodeUri` made
/// absolute (the copy lives elsewhere), and, once [`LocalTemplate::render`]ed,
/// `AWS_ENDPOINT_URL` and `SUBJECT_KMS_KEY` declared for all functions.
/// Everything else, CloudFormation tags included, is kept as it is.
#[derive(Debug)]
pub struct LocalTemplate {
    doc: Yaml,
    pub functions: Vec<LocalFunction>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LocalFunction {
    /// The name `make build` builds it under: its `target/lambda/<name>/`.
    pub name: String,
    pub logical_id: String,
    /// The variables it declares (its own and the globals), which `--env-vars` may set.
    pub variables: Vec<String>,
}

impl LocalTemplate {
    pub fn function(&self, name: &str) -> Result<&LocalFunction> {
        self.functions.iter().find(|f| f.name == name).with_context(|| {
            let names: Vec<&str> = self.functions.iter().map(|f| f.name.as_str()).collect();
            format!(
                "no function `{name}` in template.yaml (its CodeUri would be target/lambda/{name}/); there are: {}",
                names.join(", ")
            )
        })
    }

    /// The YAML to run, with `AWS_ENDPOINT_URL = endpoint` and `SUBJECT_KMS_KEY` declared in the globals.
    pub fn render(&self, endpoint: &str) -> Result<String> {
        let mut doc = self.doc.clone();
        if let Some(root) = doc.as_mapping_mut() {
            let globals = entry(root, "Globals");
            let function_globals = entry(globals, "Function");
            let environment = entry(function_globals, "Environment");
            let variables = entry(environment, "Variables");
            variables.insert("AWS_ENDPOINT_URL".into(), endpoint.into());
            variables.insert(KMS_KEY.into(), "".into());
        }
        Ok(serde_yaml::to_string(&doc)?)
    }
}

/// Declares who makes subjects' keys in a stack (its keys function); locally
/// there is none, and a writer given an empty one makes them itself...
pub(super) const KEY_FUNCTION: &str = "KEY_FUNCTION";
/// ...under the local stack's KMS key (declared for the local run: SAM passes
/// only declared variables on).
const KMS_KEY: &str = "SUBJECT_KMS_KEY";

/// template.yaml's text, with its functions' code under `root`.
pub fn local_template(template: &str, root: &Path) -> Result<LocalTemplate> {
    let mut doc: Yaml = serde_yaml::from_str(template).context("template.yaml is not valid YAML")?;
    let globals = doc.get("Globals").and_then(|g| g.get("Function")).map(declared).unwrap_or_default();
    let mut functions = Vec::new();
    let resources = doc.get_mut("Resources").and_then(Yaml::as_mapping_mut).context("template has no Resources")?;
    for (id, resource) in resources.iter_mut() {
        if resource.get("Type").and_then(Yaml::as_str) != Some("AWS::Serverless::Function") {
            continue;
        }
        let mut variables = declared(resource);
        let Some(code_uri) = resource.get_mut("Properties").and_then(|p| p.get_mut("CodeUri")) else { continue };
        let Some(path) = code_uri.as_str().map(str::to_owned) else { continue };
        *code_uri = Yaml::String(format!("{}/", root.join(path.trim_end_matches('/')).display()));
        variables.extend(globals.iter().cloned());
        if variables.iter().any(|v| v == KEY_FUNCTION) {
            variables.push(KMS_KEY.to_owned());
        }
        variables.sort();
        variables.dedup();
        functions.push(LocalFunction {
            name: Path::new(&path).file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned(),
            logical_id: id.as_str().unwrap_or_default().to_owned(),
            variables,
        });
    }
    if !doc.is_mapping() {
        bail!("template is not a mapping");
    }
    Ok(LocalTemplate { doc, functions })
}

/// The mapping under `key` of `map`, created empty when missing.
fn entry<'a>(map: &'a mut serde_yaml::Mapping, key: &str) -> &'a mut serde_yaml::Mapping {
    let value = map.entry(key.into()).or_insert_with(|| Yaml::Mapping(Default::default()));
    if !value.is_mapping() {
        *value = Yaml::Mapping(Default::default());
    }
    value.as_mapping_mut().expect("made a mapping just above")
}

/// Names under `Environment.Variables` of a function (or of `Globals.Function`).
fn declared(function: &Yaml) -> Vec<String> {
    let properties = function.get("Properties").unwrap_or(function);
    properties
        .get("Environment")
        .and_then(|e| e.get("Variables"))
        .and_then(Yaml::as_mapping)
        .map(|vars| vars.keys().filter_map(Yaml::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

pub(super) fn read_template(root: &Path) -> Result<LocalTemplate> {
    let path = root.join("template.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    local_template(&text, root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> String {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml")).unwrap()
    }

    #[test]
    fn the_local_template_changes_code_paths_and_the_endpoint_only() {
        let root = Path::new("/src/event-store");
        let local = local_template(&template(), root).unwrap();
        let playback = local.function("playback").unwrap();
        assert_eq!(playback.logical_id, "PlaybackFunction");
        assert!(playback.variables.contains(&"DYNAMO_EVENT_TABLE".to_owned()), "{:?}", playback.variables);
        assert_eq!(local.functions.len(), 10, "{:?}", local.functions);

        let mut original: Yaml = serde_yaml::from_str(&template()).unwrap();
        let mut changed: Yaml =
            serde_yaml::from_str(&local.render("http://host.docker.internal:4000").unwrap()).unwrap();
        let globals = &changed["Globals"]["Function"]["Environment"]["Variables"];
        assert_eq!(globals["AWS_ENDPOINT_URL"].as_str(), Some("http://host.docker.internal:4000"));
        let code_uri = &changed["Resources"]["PlaybackFunction"]["Properties"]["CodeUri"];
        assert_eq!(code_uri.as_str(), Some("/src/event-store/target/lambda/playback/"));
        // Put back what was changed: the rest, tags such as !Ref and !GetAtt included, is identical.
        let changed_resources = changed["Resources"].as_mapping_mut().unwrap();
        for (id, resource) in original["Resources"].as_mapping().unwrap() {
            if let Some(uri) = resource.get("Properties").and_then(|p| p.get("CodeUri")) {
                changed_resources[id]["Properties"]["CodeUri"] = uri.clone();
            }
        }
        let globals = changed["Globals"]["Function"].as_mapping_mut().unwrap();
        let original_globals = original["Globals"]["Function"].as_mapping_mut().unwrap();
        globals.remove("Environment");
        original_globals.remove("Environment");
        assert_eq!(changed, original);
    }

    #[test]
    fn an_unknown_function_names_the_ones_there_are() {
        let local = local_template(&template(), Path::new("/x")).unwrap();
        let err = local.function("nope").unwrap_err().to_string();
        assert!(err.contains("no function `nope`") && err.contains("playback") && err.contains("load"), "{err}");
    }
}
