//! template.yaml against the code: each function's environment is what its
//! configuration reads, and its IAM role grants exactly the actions its
//! stage calls (plus what the platform needs for it), on named resources only.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::{BTreeMap, BTreeSet, HashMap};

use event_store::config::{
    ArchiveConfig, KeysConfig, LoadConfig, PlaybackConfig, PrivacyConfig, PumpConfig, RelayConfig, ScanConfig,
    StreamsConfig, SubscriptionConfig, Variables,
};
use serde_yaml::Value;

fn template() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml");
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `(logical id, the stage's variables, the stage's actions, actions the platform needs on top)`.
fn functions() -> Vec<(&'static str, Variables, &'static [&'static str], &'static [&'static str])> {
    vec![
        ("LoadFunction", LoadConfig::VARIABLES, event_store::load::AWS_ACTIONS, &[]),
        (
            "PumpFunction",
            PumpConfig::VARIABLES,
            event_store::pump::AWS_ACTIONS,
            // The Kinesis event source mapping reads the stream and writes failures to the DLQ.
            &[
                "kinesis:DescribeStream",
                "kinesis:DescribeStreamSummary",
                "kinesis:GetRecords",
                "kinesis:GetShardIterator",
                "kinesis:ListShards",
                "sqs:SendMessage",
            ],
        ),
        ("ScanFunction", ScanConfig::VARIABLES, event_store::scan::AWS_ACTIONS, &[]),
        ("PlaybackFunction", PlaybackConfig::VARIABLES, event_store::playback::AWS_ACTIONS, &[]),
        ("SubscriptionsFunction", SubscriptionConfig::VARIABLES, event_store::subscription::AWS_ACTIONS, &[]),
        // And GET /views beside /streams: the views' reads.
        (
            "StreamsFunction",
            StreamsConfig::VARIABLES,
            event_store::entity::AWS_ACTIONS,
            event_store::views::http::AWS_ACTIONS,
        ),
        ("ArchiveFunction", ArchiveConfig::VARIABLES, event_store::archiver::AWS_ACTIONS, &[]),
        ("PrivacyFunction", PrivacyConfig::VARIABLES, event_store::privacy::manage::AWS_ACTIONS, &[]),
        ("KeysFunction", KeysConfig::VARIABLES, event_store::privacy::manage::KEYS_AWS_ACTIONS, &[]),
        (
            "RelayFunction",
            RelayConfig::VARIABLES,
            event_store::entity::relay::AWS_ACTIONS,
            // The DynamoDB stream event source mapping reads the table's stream and writes failures to the DLQ.
            &[
                "dynamodb:DescribeStream",
                "dynamodb:GetRecords",
                "dynamodb:GetShardIterator",
                "dynamodb:ListStreams",
                "sqs:SendMessage",
            ],
        ),
    ]
}

fn strings(value: &Value) -> Vec<String> {
    match value {
        Value::String(s) => vec![s.clone()],
        Value::Sequence(items) => items.iter().flat_map(strings).collect(),
        _ => vec![],
    }
}

#[test]
fn environment_variables_are_exactly_the_ones_the_code_reads() {
    let template = template();
    for (name, variables, _, _) in functions() {
        let env = &template["Resources"][name]["Properties"]["Environment"]["Variables"];
        let set: BTreeSet<String> = env.as_mapping().unwrap().keys().map(|k| k.as_str().unwrap().to_owned()).collect();
        for required in variables.required {
            assert!(set.contains(*required), "{name} must set {required}");
        }
        for key in &set {
            assert!(variables.declares(key), "{name} sets {key}, which its code never reads");
        }
        for value in env.as_mapping().unwrap().values() {
            assert!(
                matches!(value, Value::Tagged(_)),
                "{name}: {value:?} should come from !Ref/!GetAtt, not be hard-coded"
            );
        }
    }
}

#[test]
fn each_role_grants_exactly_what_its_function_calls_on_its_own_resources() {
    let template = template();
    for (name, _, actions, platform) in functions() {
        let policies = &template["Resources"][name]["Properties"]["Policies"];
        let statements: Vec<&Value> =
            policies.as_sequence().unwrap().iter().flat_map(|p| p["Statement"].as_sequence().unwrap().iter()).collect();
        let mut granted = BTreeSet::new();
        for statement in &statements {
            assert_eq!(statement["Effect"], Value::String("Allow".into()));
            let resource = &statement["Resource"];
            assert!(!strings(resource).iter().any(|r| r == "*"), "{name}: resource * in {statement:?}");
            let named = |r: &Value| matches!(r, Value::Tagged(_));
            let all_named = named(resource) || resource.as_sequence().is_some_and(|rs| rs.iter().all(named));
            assert!(all_named, "{name}: resources are named by !GetAtt/!Sub: {resource:?}");
            for action in strings(&statement["Action"]) {
                assert!(!action.contains('*'), "{name}: wildcard action {action}");
                granted.insert(action);
            }
        }
        let expected: BTreeSet<String> = actions.iter().chain(platform).map(|a| a.to_string()).collect();
        assert_eq!(granted, expected, "{name}");
    }
}

#[test]
fn subjects_keys_are_read_by_readers_and_writers_made_by_the_keys_function_and_forgotten_by_the_privacy_function() {
    // IAM cannot require a write's condition: a role that may put a key item may overwrite one (and
    // lose every event sealed under it). So writers only read keys and ask the keys function for a
    // new one (its code only ever adds a generation); only the privacy function destroys them.
    let template = template();
    let mut on_keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut on_kms: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut invoking: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, _, _, _) in functions() {
        let policies = &template["Resources"][name]["Properties"]["Policies"];
        for statement in policies.as_sequence().unwrap().iter().flat_map(|p| p["Statement"].as_sequence().unwrap()) {
            let resource = format!("{:?}", statement["Resource"]);
            for (holder, map) in
                [("KeyTable", &mut on_keys), ("SubjectKey", &mut on_kms), ("KeysFunction", &mut invoking)]
            {
                if resource.contains(holder) {
                    map.entry(name.to_owned()).or_default().extend(strings(&statement["Action"]));
                }
            }
        }
    }
    let set = |actions: &[&str]| actions.iter().map(|a| a.to_string()).collect::<BTreeSet<_>>();
    let expected_keys = BTreeMap::from([
        ("KeysFunction".to_owned(), set(&["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"])),
        ("LoadFunction".to_owned(), set(&["dynamodb:GetItem"])),
        ("PlaybackFunction".to_owned(), set(&["dynamodb:GetItem"])),
        ("PrivacyFunction".to_owned(), set(event_store::privacy::manage::AWS_ACTIONS)),
        ("StreamsFunction".to_owned(), set(&["dynamodb:GetItem"])),
        ("SubscriptionsFunction".to_owned(), set(&["dynamodb:GetItem"])),
    ]);
    assert_eq!(on_keys, expected_keys);
    let expected_kms = BTreeMap::from([
        ("KeysFunction".to_owned(), set(&["kms:GenerateDataKeyWithoutPlaintext"])),
        ("LoadFunction".to_owned(), set(&["kms:Decrypt"])),
        ("PlaybackFunction".to_owned(), set(&["kms:Decrypt"])),
        ("StreamsFunction".to_owned(), set(&["kms:Decrypt"])),
        ("SubscriptionsFunction".to_owned(), set(&["kms:Decrypt"])),
    ]);
    assert_eq!(on_kms, expected_kms, "the keys and privacy functions never see a key, only wrapped ones");
    let expected_invoking = BTreeMap::from([
        ("LoadFunction".to_owned(), set(&["lambda:InvokeFunction"])),
        ("StreamsFunction".to_owned(), set(&["lambda:InvokeFunction"])),
    ]);
    assert_eq!(invoking, expected_invoking, "the writers ask the keys function for new keys");
    // The KMS key disabled or its deletion scheduled stops every reader: said on the alarm topic,
    // which lets that rule publish.
    let rule = &template["Resources"]["SubjectKeyChangeRule"]["Properties"];
    let calls = strings(&rule["EventPattern"]["detail"]["eventName"]);
    assert!(calls.contains(&"DisableKey".into()) && calls.contains(&"ScheduleKeyDeletion".into()), "{calls:?}");
    let on = format!("{:?}", rule["EventPattern"]["detail"]["resources"]["ARN"]);
    assert!(on.contains("SubjectKey.Arn"), "{on}");
    assert_eq!(referenced(&rule["Targets"][0]["Arn"]).as_deref(), Some("AlarmTopic"));
    // A topic policy replaces the default one: the alarms must still be let publish.
    let policy = &template["Resources"]["AlarmTopicPolicy"]["Properties"]["PolicyDocument"]["Statement"];
    let publishers: Vec<(String, String)> = policy
        .as_sequence()
        .unwrap()
        .iter()
        .map(|s| (strings(&s["Principal"]["Service"]).concat(), format!("{:?}", s["Condition"])))
        .collect();
    assert_eq!(publishers.len(), 2, "{publishers:?}");
    assert!(publishers[0].0 == "cloudwatch.amazonaws.com" && publishers[0].1.contains("aws:SourceAccount"));
    assert!(publishers[1].0 == "events.amazonaws.com" && publishers[1].1.contains("SubjectKeyChangeRule.Arn"));
    let table = &template["Resources"]["KeyTable"];
    assert_eq!(table["DeletionPolicy"], Value::String("Retain".into()), "losing it loses every sealed event");
    assert!(table["Properties"].get("PointInTimeRecoverySpecification").is_none(), "a backup would bring keys back");
    let params = &template["Parameters"];
    assert_eq!(
        (&params["SubjectHashKey"]["NoEcho"], &params["SubjectHashKey"]["MinLength"]),
        (&Value::Bool(true), &Value::from(32))
    );
    assert_eq!(params["IpMode"]["Default"], Value::String("none".into()), "data protection by default");
}

#[test]
fn self_invocation_is_granted_on_the_function_itself_only() {
    let template = template();
    for (name, suffix) in [
        ("ScanFunction", "-scan"),
        ("PlaybackFunction", "-playback"),
        ("SubscriptionsFunction", "-subscriptions"),
        ("ArchiveFunction", "-archive"),
    ] {
        let function_name = format!("{:?}", template["Resources"][name]["Properties"]["FunctionName"]);
        assert!(function_name.contains(&format!("${{Stage}}{suffix}")), "{function_name}");
        let statements = template["Resources"][name]["Properties"]["Policies"][0]["Statement"].as_sequence().unwrap();
        let invoke =
            statements.iter().find(|s| strings(&s["Action"]).contains(&"lambda:InvokeFunction".into())).unwrap();
        let resource = format!("{:?}", invoke["Resource"]);
        assert!(resource.contains(&format!(":function:${{Service}}-${{Stage}}{suffix}")), "{name}: {resource}");
    }
}

#[test]
fn the_pump_may_invoke_the_scan_and_nothing_else() {
    let template = template();
    let pump = &template["Resources"]["PumpFunction"]["Properties"];
    let scan_name = format!("{:?}", template["Resources"]["ScanFunction"]["Properties"]["FunctionName"]);
    assert_eq!(format!("{:?}", pump["Environment"]["Variables"]["SCAN_FUNCTION"]), scan_name, "the scan it wakes");
    let statements = pump["Policies"][0]["Statement"].as_sequence().unwrap();
    let invokes: Vec<_> =
        statements.iter().filter(|s| strings(&s["Action"]).contains(&"lambda:InvokeFunction".into())).collect();
    assert_eq!(invokes.len(), 1);
    let resource = format!("{:?}", invokes[0]["Resource"]);
    assert!(resource.contains(":function:${Service}-${Stage}-scan\")"), "{resource}");
}

#[test]
fn the_scan_may_invoke_itself_and_the_subscriptions_tick_alias_and_nothing_else() {
    let template = template();
    let scan = &template["Resources"]["ScanFunction"]["Properties"];
    // The alias only ticks (subscription::TICK_ALIAS) and points at the function's code.
    let alias = &template["Resources"]["SubscriptionsTickAlias"];
    assert_eq!(alias["Type"].as_str(), Some("AWS::Lambda::Alias"));
    assert_eq!(alias["Properties"]["Name"].as_str(), Some(event_store::subscription::TICK_ALIAS));
    assert_eq!(alias["Properties"]["FunctionVersion"].as_str(), Some("$LATEST"));
    let aliased = format!("{:?}", alias["Properties"]["FunctionName"]);
    assert!(aliased.contains("Ref") && aliased.contains("\"SubscriptionsFunction\""), "{aliased}");
    let function = template["Resources"]["SubscriptionsFunction"]["Properties"]["FunctionName"].clone();
    let tick = format!("{:?}", function).replace("-subscriptions\"", "-subscriptions:tick\"");
    assert_eq!(format!("{:?}", scan["Environment"]["Variables"]["SUBSCRIPTIONS_TICK"]), tick);
    let statements = scan["Policies"][0]["Statement"].as_sequence().unwrap();
    let mut invoked: Vec<String> = statements
        .iter()
        .filter(|s| strings(&s["Action"]).contains(&"lambda:InvokeFunction".into()))
        .map(|s| format!("{:?}", s["Resource"]))
        .collect();
    invoked.sort();
    assert_eq!(invoked.len(), 2, "{invoked:?}");
    assert!(invoked[0].contains(":function:${Service}-${Stage}-scan\")"), "{invoked:?}");
    // The alias's ARN alone: the unqualified function also takes management actions.
    assert!(invoked[1].contains(":function:${Service}-${Stage}-subscriptions:tick\")"), "{invoked:?}");
}

#[test]
fn the_event_source_mapping_reports_failures_and_keeps_what_it_gives_up_on() {
    let template = template();
    let mapping = &template["Resources"]["PumpEventSource"]["Properties"];
    assert_eq!(strings(&mapping["FunctionResponseTypes"]), vec!["ReportBatchItemFailures"]);
    assert_eq!(mapping["BisectBatchOnFunctionError"], Value::Bool(true));
    // Retries until the record age limit, never a fixed count that a few minutes of throttling use up...
    assert_eq!(mapping["MaximumRetryAttempts"].as_i64(), Some(-1), "retry until the record age limit");
    // ...and that limit stays well inside the shortest stream retention, so a record given up
    // on can still be re-read from the stream and re-driven.
    let age = mapping["MaximumRecordAgeInSeconds"].as_i64().unwrap();
    let retention = &template["Parameters"]["StreamRetentionHours"];
    let shortest = retention["MinValue"].as_i64().unwrap().min(retention["Default"].as_i64().unwrap()) * 3600;
    assert!((60..=shortest / 2).contains(&age), "record age {age} s vs retention {shortest} s");
    // Readers drop a second copy of an accepted event within the dedupe window:
    // load's retries of an ambiguous put end within its timeout.
    let load_timeout = template["Resources"]["LoadFunction"]["Properties"]["Timeout"].as_u64().unwrap();
    assert!(load_timeout * 1000 * 3 <= event_store::config::DEFAULT_DEDUPE_WINDOW_MS, "load timeout {load_timeout} s");
    // The pump's shard positions need one batch per shard at a time, in order.
    assert!(mapping["ParallelizationFactor"].as_u64().is_none_or(|p| p == 1), "one batch per shard at a time");
    assert!(format!("{:?}", mapping["DestinationConfig"]["OnFailure"]["Destination"]).contains("PumpDeadLetterQueue"));
}

#[test]
fn the_relay_sees_only_batch_items_holds_a_stream_before_its_mapping_gives_up_and_alarms() {
    let template = template();
    let mapping = &template["Resources"]["RelayEventSource"]["Properties"];
    assert!(format!("{:?}", mapping["EventSourceArn"]).contains("EntityTable.StreamArn"));
    assert_eq!(strings(&mapping["FunctionResponseTypes"]), vec!["ReportBatchItemFailures"]);
    assert_eq!(mapping["ParallelizationFactor"].as_u64(), Some(1), "one batch per shard: version order");
    assert_eq!(mapping["MaximumRetryAttempts"].as_i64(), Some(-1));
    let age = mapping["MaximumRecordAgeInSeconds"].as_i64().unwrap();
    assert!((60..=12 * 3600).contains(&age), "inside the table stream's 24 h: {age}");
    assert!(format!("{:?}", mapping["DestinationConfig"]["OnFailure"]["Destination"]).contains("RelayDeadLetterQueue"));
    // The relay holds a failing stream (and the others move on) before its mapping would give up.
    let hold = &template["Parameters"]["RelayHoldAfterSeconds"];
    assert!(hold["MaxValue"].as_i64().unwrap() < age, "the hold limit stays under the record age limit");
    assert_eq!(hold["Default"].as_u64(), Some(event_store::config::DEFAULT_RELAY_HOLD_AFTER_SECONDS));
    // Only inserts of batch items invoke it (not tips, snapshots, nor the positions it writes
    // itself), and changes of tips that carry a retention (it cleans up after them).
    let filters = mapping["FilterCriteria"]["Filters"].as_sequence().unwrap();
    assert_eq!(filters.len(), 2);
    let tips: serde_json::Value = serde_json::from_str(filters[1]["Pattern"].as_str().unwrap()).unwrap();
    assert_eq!(tips["eventName"], serde_json::json!(["MODIFY"]));
    assert_eq!(tips["dynamodb"]["Keys"]["item"]["S"], serde_json::json!([event_store::entity::model::TIP]));
    // A leaf attribute: event filters match `exists` on leaves only.
    assert_eq!(tips["dynamodb"]["NewImage"]["retention"]["S"], serde_json::json!([{"exists": true}]));
    let pattern: serde_json::Value = serde_json::from_str(filters[0]["Pattern"].as_str().unwrap()).unwrap();
    assert_eq!(pattern["eventName"], serde_json::json!(["INSERT"]));
    let prefix = pattern["dynamodb"]["Keys"]["item"]["S"][0]["prefix"].as_str().unwrap();
    assert!(event_store::entity::model::batch_key(7).starts_with(prefix));
    for other in [event_store::entity::model::TIP, event_store::entity::model::SNAPSHOT] {
        assert!(!other.starts_with(prefix), "{other}");
    }
    for position in
        [event_store::bookkeeping::entity_positions::RELAY_ITEM, event_store::bookkeeping::entity_positions::LOG_ITEM]
    {
        assert!(!position.starts_with(prefix), "{position}");
    }
    // A held stream, a failing relay and a throttled relay each raise an alarm.
    let resources = &template["Resources"];
    let watched = |alarm: &str| format!("{:?}", resources[alarm]["Properties"]);
    assert!(watched("RelayDeadLetterAlarm").contains("RelayDeadLetterQueue"));
    assert!(
        watched("RelayIteratorAgeAlarm").contains("IteratorAge")
            && watched("RelayIteratorAgeAlarm").contains("RelayFunction")
    );
    assert!(watched("RelayErrorsAlarm").contains("Errors") && watched("RelayErrorsAlarm").contains("RelayFunction"));
    assert!(
        watched("ThrottlesAlarm").contains("RelayFunction") && watched("ThrottlesAlarm").contains("FILL(relay, 0)")
    );
    let table = &template["Resources"]["EntityTable"]["Properties"];
    assert_eq!(table["StreamSpecification"]["StreamViewType"].as_str(), Some("NEW_IMAGE"));
    let keys: Vec<String> = table["KeySchema"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|k| k["AttributeName"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, [event_store::entity::model::HASH_KEY, event_store::entity::model::RANGE_KEY]);
    // The entity API is application data: every /streams route is signed (SigV4), unlike the pixel;
    // so are the views (read models of it) beside it.
    let events = template["Resources"]["StreamsFunction"]["Properties"]["Events"].as_mapping().unwrap();
    let paths: Vec<&str> = events.values().map(|e| e["Properties"]["Path"].as_str().unwrap()).collect();
    assert_eq!(paths.iter().filter(|p| p.starts_with("/streams/{name}")).count(), 7, "{paths:?}");
    assert_eq!(paths.iter().filter(|p| p.starts_with("/views/{projection}")).count(), 2, "{paths:?}");
    for (name, event) in events {
        assert_eq!(event["Properties"]["Auth"]["Authorizer"].as_str(), Some("AWS_IAM"), "{name:?}");
    }
}

#[test]
fn self_invoking_functions_declare_their_recursion_and_drop_stale_continuations() {
    let template = template();
    for name in ["ScanFunction", "PlaybackFunction", "SubscriptionsFunction"] {
        let properties = &template["Resources"][name]["Properties"];
        // Else Lambda's recursive loop detection stops every chain after about 16 hops.
        assert_eq!(properties["RecursiveLoop"].as_str(), Some("Allow"), "{name}");
        let age = properties["EventInvokeConfig"]["MaximumEventAgeInSeconds"].as_u64();
        assert!(age.is_some_and(|age| (60..=900).contains(&age)), "{name}: a queued continuation expires: {age:?}");
    }
}

#[test]
fn the_public_endpoints_are_throttled_and_take_small_events_by_default() {
    let template = template();
    let parameters = &template["Parameters"];
    let routes = &template["Resources"]["HttpApi"]["Properties"]["DefaultRouteSettings"];
    for (setting, parameter) in [("ThrottlingRateLimit", "ApiRateLimit"), ("ThrottlingBurstLimit", "ApiBurstLimit")] {
        assert!(format!("{:?}", routes[setting]).contains(parameter), "{setting} from {parameter}");
        assert!(parameters[parameter]["Default"].as_u64().is_some_and(|v| v > 0), "{parameter} has a default");
    }
    let rate = parameters["ApiRateLimit"]["Default"].as_u64().unwrap();
    assert!(rate < 1000, "the default rate fits one event shard (1,000 records/s): {rate}");
    let max_event = &parameters["MaxEventBytes"];
    assert_eq!(max_event["Default"].as_u64(), Some(event_store::config::DEFAULT_MAX_EVENT_BYTES as u64));
    // Up to the large limit: the load function always has the bucket to offload to.
    assert_eq!(max_event["MaxValue"].as_u64(), Some(event_store::offload::MAX_LARGE_EVENT_BYTES as u64));
    let inline = &parameters["InlineMaxBytes"];
    assert_eq!(inline["Default"].as_u64(), Some(event_store::offload::DEFAULT_INLINE_MAX_BYTES as u64));
    assert_eq!(inline["MaxValue"].as_u64(), Some(event_store::offload::INLINE_MAX_BYTES_LIMIT as u64));
    let env = &template["Resources"]["LoadFunction"]["Properties"]["Environment"]["Variables"];
    assert!(format!("{:?}", env["MAX_EVENT_BYTES"]).contains("MaxEventBytes"));
    // The function URL (no route throttling) is off by default, and on, the load function's
    // reserved concurrency bounds what anonymous callers can spend.
    assert_eq!(parameters["PixelFunctionUrl"]["Default"].as_str(), Some("off"));
    for resource in ["LoadFunctionUrl", "LoadFunctionUrlPermission", "LoadFunctionUrlInvokePermission"] {
        assert_eq!(template["Resources"][resource]["Condition"].as_str(), Some("UseFunctionUrl"), "{resource}");
    }
    // A URL made since October 2025 answers 403 unless lambda:InvokeFunction is granted too,
    // and that grant must be for calls through the URL only.
    let invoke = &template["Resources"]["LoadFunctionUrlInvokePermission"]["Properties"];
    assert_eq!(invoke["Action"].as_str(), Some("lambda:InvokeFunction"));
    assert_eq!(invoke["InvokedViaFunctionUrl"].as_bool(), Some(true));
    let url = &template["Resources"]["LoadFunctionUrlPermission"]["Properties"];
    assert_eq!(url["Action"].as_str(), Some("lambda:InvokeFunctionUrl"));
    assert_eq!(url["FunctionUrlAuthType"].as_str(), Some("NONE"));
    let reserved = &template["Resources"]["LoadFunction"]["Properties"]["ReservedConcurrentExecutions"];
    let reserved = format!("{reserved:?}");
    assert!(reserved.contains("UseFunctionUrl") && reserved.contains("LoadReservedConcurrency"), "{reserved}");
}

/// The default of a parameter a value refers to (`!Ref Name`, read by serde_yaml as a tagged value).
fn default_of(template: &Value, value: &Value) -> f64 {
    let text = format!("{value:?}");
    let name = template["Parameters"]
        .as_mapping()
        .unwrap()
        .keys()
        .filter_map(Value::as_str)
        .find(|name| text.contains(&format!("\"{name}\"")))
        .unwrap_or_else(|| panic!("{text} names no parameter"));
    let default = &template["Parameters"][name]["Default"];
    default.as_f64().unwrap_or_else(|| panic!("{name} has a number default"))
}

#[test]
fn anonymous_ingest_fits_the_event_stream_in_records_and_bytes_by_default() {
    // Kinesis takes 1,000 records/s and 1 MiB/s a shard, counting data and partition key.
    let template = template();
    let parameters = &template["Parameters"];
    let shards = parameters["EventShardCount"]["Default"].as_f64().unwrap();
    let load = &template["Resources"]["LoadFunction"]["Properties"];
    let env = &load["Environment"]["Variables"];
    let per_post = match &env["MAX_EVENTS_PER_POST"] {
        Value::Null => event_store::load::MAX_EVENTS_PER_POST as f64,
        value => default_of(&template, value),
    };
    let event_bytes = default_of(&template, &env["MAX_EVENT_BYTES"]) + 256.0;
    let default_rate = default_of(
        &template,
        &template["Resources"]["HttpApi"]["Properties"]["DefaultRouteSettings"]["ThrottlingRateLimit"],
    );
    let (mut records, mut routes) = (0.0, 0);
    for (_, event) in load["Events"].as_mapping().unwrap() {
        let properties = &event["Properties"];
        assert_eq!(event["Type"].as_str(), Some("HttpApi"));
        let rate = match &properties["RouteSettings"]["ThrottlingRateLimit"] {
            Value::Null => default_rate,
            own => default_of(&template, own),
        };
        let path = properties["Path"].as_str().unwrap();
        let per_request = match path {
            "/events" => per_post,
            // The tracker script puts no event.
            _ if path.ends_with(event_store::load::TRACKER_SCRIPT) => 0.0,
            _ => 1.0,
        };
        records += rate * per_request;
        routes += 1;
    }
    assert_eq!(routes, 4, "GET and POST /track.gif, POST /events, GET the tracker script");
    let script = load["Events"]["Script"]["Properties"]["Path"].as_str().unwrap();
    assert_eq!(script, format!("/{}", event_store::load::TRACKER_SCRIPT), "the route serves the version load serves");
    assert!(records <= 1000.0 * shards, "{records} records/s at the routes' rates on {shards} shard(s)");
    let bytes = records * event_bytes;
    assert!(bytes <= 1_048_576.0 * shards, "{bytes} bytes/s at the routes' rates on {shards} shard(s)");
    assert_eq!(per_post as usize, event_store::config::DEFAULT_MAX_EVENTS_PER_POST);
    assert!(per_post as usize <= event_store::load::MAX_EVENTS_PER_POST);
}

#[test]
fn the_lag_alarm_watches_the_metric_the_tick_writes_and_fires_when_the_tick_is_silent() {
    let template = template();
    let alarm = &template["Resources"]["SubscriptionLagAlarm"]["Properties"];
    assert_eq!(alarm["MetricName"].as_str(), Some(event_store::subscription::metrics::LAG_METRIC));
    let function = &template["Resources"]["SubscriptionsFunction"]["Properties"];
    let namespace = &function["Environment"]["Variables"]["METRICS_NAMESPACE"];
    assert_eq!(format!("{:?}", alarm["Namespace"]), format!("{namespace:?}"), "the namespace the function writes to");
    assert!(alarm["Dimensions"].is_null(), "the metric without dimensions: the largest lag of all");
    assert_eq!(alarm["TreatMissingData"].as_str(), Some("breaching"), "a tick that stopped writing is an alarm");
    // Targets the role may reach: streams and functions named <service>-<stage>-sub-*, nothing else.
    let statements = function["Policies"][0]["Statement"].as_sequence().unwrap();
    for statement in statements
        .iter()
        .filter(|s| strings(&s["Action"]).iter().any(|a| a.starts_with("kinesis:") || a.starts_with("lambda:")))
    {
        let resources = match &statement["Resource"] {
            Value::Sequence(items) => items.clone(),
            one => vec![one.clone()],
        };
        for resource in resources.iter().map(|r| format!("{r:?}")) {
            assert!(
                resource.contains("${Service}-${Stage}-sub-*")
                    || resource.contains("${Service}-${Stage}-subscriptions\""),
                "{resource}"
            );
        }
    }
}

/// The text inside a `!Sub` (or a plain string).
fn sub_text(value: &Value) -> String {
    match value {
        Value::Tagged(tagged) if tagged.tag == "!Sub" => sub_text(&tagged.value),
        Value::String(s) => s.clone(),
        other => panic!("not a !Sub string: {other:?}"),
    }
}

fn alarms(template: &Value) -> Vec<(String, Value)> {
    let resources = template["Resources"].as_mapping().unwrap();
    resources
        .iter()
        .filter(|(_, r)| r["Type"].as_str() == Some("AWS::CloudWatch::Alarm"))
        .map(|(name, r)| (name.as_str().unwrap().to_owned(), r["Properties"].clone()))
        .collect()
}

/// `!Ref X` or `!GetAtt X.Attr` -> `X`.
fn referenced(value: &Value) -> Option<String> {
    match value {
        Value::Tagged(tagged) if tagged.tag == "!Ref" => tagged.value.as_str().map(str::to_owned),
        Value::Tagged(tagged) if tagged.tag == "!GetAtt" => {
            tagged.value.as_str().and_then(|s| s.split('.').next()).map(str::to_owned)
        }
        _ => None,
    }
}

#[test]
fn the_watermark_lag_alarm_watches_the_metric_the_scan_writes_and_fires_when_the_scan_is_silent() {
    let template = template();
    let alarm = &template["Resources"]["WatermarkLagAlarm"]["Properties"];
    assert_eq!(alarm["MetricName"].as_str(), Some(event_store::metrics::WATERMARK_LAG_METRIC));
    let scan = &template["Resources"]["ScanFunction"]["Properties"];
    let namespace = sub_text(&scan["Environment"]["Variables"]["METRICS_NAMESPACE"]);
    assert_eq!(sub_text(&alarm["Namespace"]), namespace, "the namespace the scan writes to");
    let subscriptions = &template["Resources"]["SubscriptionsFunction"]["Properties"];
    assert_eq!(sub_text(&subscriptions["Environment"]["Variables"]["METRICS_NAMESPACE"]), namespace, "one namespace");
    assert!(alarm["Dimensions"].is_null(), "the scan writes the metric without dimensions");
    assert_eq!(alarm["TreatMissingData"].as_str(), Some("breaching"), "a scan that stopped running is an alarm");
    assert_eq!(referenced(&alarm["Threshold"]).as_deref(), Some("WatermarkLagAlarmSeconds"));
}

/// Everything that can stall or fail alone alarms: every function's errors
/// and throttles, every queue something waits in, each to the one topic,
/// which an email can subscribe to through a parameter.
#[test]
fn every_function_and_every_queue_has_an_alarm_on_the_one_topic() {
    let template = template();
    let resources = template["Resources"].as_mapping().unwrap();
    let of_type = |kind: &str| -> Vec<String> {
        resources
            .iter()
            .filter(|(_, r)| r["Type"].as_str() == Some(kind))
            .map(|(name, _)| name.as_str().unwrap().to_owned())
            .collect()
    };
    let alarms = alarms(&template);
    let watched = |namespace: &str, metric: &str| -> BTreeSet<String> {
        alarms
            .iter()
            .filter(|(_, p)| p["Namespace"].as_str() == Some(namespace) && p["MetricName"].as_str() == Some(metric))
            .filter_map(|(_, p)| referenced(&p["Dimensions"][0]["Value"]))
            .collect()
    };
    let mut functions: BTreeSet<String> = of_type("AWS::Serverless::Function").into_iter().collect();
    assert_eq!(functions.len(), 10);
    assert_eq!(watched("AWS/Lambda", "Errors"), functions, "an errors alarm per function");
    // The archive exists only with HotRetentionDays > 0, so the one throttles alarm cannot name it;
    // it runs one at a time (reserved concurrency 1), and a throttled start is retried.
    assert_eq!(template["Resources"]["ArchiveFunction"]["Condition"].as_str(), Some("ArchiveEnabled"));
    assert_eq!(template["Resources"]["ArchiveErrorsAlarm"]["Condition"].as_str(), Some("ArchiveEnabled"));
    functions.remove("ArchiveFunction");
    let throttles = alarms.iter().find(|(name, _)| name == "ThrottlesAlarm").unwrap();
    let throttled: BTreeSet<String> = throttles.1["Metrics"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|m| referenced(&m["MetricStat"]["Metric"]["Dimensions"][0]["Value"]))
        .collect();
    assert_eq!(throttled, functions, "every function's throttles");
    let queues: BTreeSet<String> = of_type("AWS::SQS::Queue").into_iter().collect();
    assert_eq!(watched("AWS/SQS", "ApproximateNumberOfMessagesVisible"), queues, "an alarm per queue");
    for (name, properties) in &alarms {
        let actions: Vec<_> = properties["AlarmActions"].as_sequence().unwrap().iter().filter_map(referenced).collect();
        assert_eq!(actions, ["AlarmTopic"], "{name} notifies the topic");
    }
    let email = &template["Resources"]["AlarmEmailSubscription"];
    assert_eq!(email["Condition"].as_str(), Some("HasAlarmEmail"), "no address, no subscription");
    assert_eq!(referenced(&email["Properties"]["Endpoint"]).as_deref(), Some("AlarmEmail"));
    assert_eq!(template["Parameters"]["AlarmEmail"]["Default"].as_str(), Some(""));
}

/// The dashboard's body is JSON once CloudFormation has substituted it, and
/// shows what the code writes and every function and queue of the stack.
#[test]
fn the_dashboard_is_json_and_shows_every_function_queue_and_metric_the_code_writes() {
    let template = template();
    let body = sub_text(&template["Resources"]["Dashboard"]["Properties"]["DashboardBody"]);
    let mut names = BTreeSet::new();
    let mut rest = body.as_str();
    let mut substituted = String::new();
    while let Some(start) = rest.find("${") {
        let end = start + rest[start..].find('}').unwrap();
        let name = &rest[start + 2..end];
        names.insert(name.split('.').next().unwrap().to_owned());
        substituted.push_str(&rest[..start]);
        substituted.push('x');
        rest = &rest[end + 1..];
    }
    substituted.push_str(rest);
    let dashboard: serde_json::Value = serde_json::from_str(&substituted).expect("the dashboard body is JSON");
    let resources = template["Resources"].as_mapping().unwrap();
    for (name, resource) in resources {
        let kind = resource["Type"].as_str().unwrap();
        if matches!(kind, "AWS::Serverless::Function" | "AWS::SQS::Queue") {
            // A resource that may not exist is named by its name, not referenced.
            let shown = names.contains(name.as_str().unwrap())
                || (name.as_str() == Some("ArchiveFunction") && body.contains("${Service}-${Stage}-archive"));
            assert!(shown, "{name:?} is on the dashboard");
        }
    }
    for name in &names {
        assert!(
            name.starts_with("AWS::")
                || resources.contains_key(name.as_str())
                || template["Parameters"].get(name).is_some(),
            "{name} is a resource or parameter"
        );
    }
    // The functions' METRICS_NAMESPACE, `EventStore/${Service}-${Stage}`, substituted as above.
    let shown: BTreeSet<(String, String)> = dashboard["widgets"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| w["properties"]["metrics"].as_array().unwrap())
        .map(|m| (m[0].as_str().unwrap().to_owned(), m[1].as_str().unwrap().to_owned()))
        .collect();
    for metric in [
        event_store::metrics::WATERMARK_LAG_METRIC,
        event_store::subscription::metrics::LAG_METRIC,
        event_store::metrics::QUARANTINED_METRIC,
    ] {
        assert!(shown.contains(&("EventStore/x-x".to_owned(), metric.to_owned())), "{metric} in {shown:?}");
    }
}

/// The store's bucket: private, encrypted, versioned, TLS only, kept when
/// the stack goes, and named as the readers' grants name it; always there
/// (large payloads), while the archiving itself exists only with HotRetentionDays > 0.
#[test]
fn the_stores_bucket_is_private_encrypted_versioned_and_archiving_only_with_hot_retention() {
    let template = template();
    let resources = &template["Resources"];
    let bucket = &resources["ArchiveBucket"];
    assert!(bucket.get("Condition").is_none(), "large payloads need the bucket also without archiving");
    assert_eq!(bucket["DeletionPolicy"].as_str(), Some("Retain"), "events kept for good outlive the stack");
    let properties = &bucket["Properties"];
    let block = properties["PublicAccessBlockConfiguration"].as_mapping().unwrap();
    assert_eq!(block.len(), 4);
    assert!(block.values().all(|v| v == &Value::Bool(true)), "{block:?}");
    assert_eq!(properties["VersioningConfiguration"]["Status"].as_str(), Some("Enabled"));
    let sse = &properties["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"];
    assert_eq!(sse["SSEAlgorithm"].as_str(), Some("AES256"));
    let name = format!("{:?}", properties["BucketName"]);
    assert!(name.contains("${Service}-${Stage}-archive-${AWS::AccountId}-${AWS::Region}"), "{name}");
    let tls = &resources["ArchiveBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"][0];
    assert_eq!(tls["Effect"].as_str(), Some("Deny"));
    assert!(format!("{:?}", tls["Condition"]).contains("aws:SecureTransport"));
    for reader in ["PlaybackFunction", "SubscriptionsFunction"] {
        // Named as the bucket is, also with archiving turned off later: what was archived stays readable.
        let env = format!("{:?}", resources[reader]["Properties"]["Environment"]["Variables"]["ARCHIVE_BUCKET"]);
        assert!(env.contains("${Service}-${Stage}-archive-${AWS::AccountId}-${AWS::Region}"), "{reader}: {env}");
        let grants = format!("{:?}", resources[reader]["Properties"]["Policies"]);
        for prefix in ["events/*", "payloads/*"] {
            let object = format!("${{Service}}-${{Stage}}-archive-${{AWS::AccountId}}-${{AWS::Region}}/{prefix}");
            assert!(grants.contains(&object), "{reader}: {prefix}");
        }
    }
    // The archiver: its objects and the manifest's anchors, nothing else of the bucket.
    let archiver = format!("{:?}", resources["ArchiveFunction"]["Properties"]["Policies"]);
    for prefix in ["${ArchiveBucket.Arn}/events/*", "${ArchiveBucket.Arn}/manifest/*"] {
        assert!(archiver.contains(prefix), "ArchiveFunction: {prefix}");
    }
    assert!(!archiver.contains("payloads/"), "the archiver never touches payloads");
    // The writers of large payloads: to payloads/ only.
    for writer in ["LoadFunction", "StreamsFunction"] {
        let env = &resources[writer]["Properties"]["Environment"]["Variables"];
        assert!(format!("{:?}", env["ARCHIVE_BUCKET"]).contains("ArchiveBucket"), "{writer}");
        assert!(format!("{:?}", env["INLINE_MAX_BYTES"]).contains("InlineMaxBytes"), "{writer}");
        let grants = format!("{:?}", resources[writer]["Properties"]["Policies"]);
        assert!(grants.contains("${ArchiveBucket.Arn}/payloads/*"), "{writer}");
    }
    assert!(!format!("{:?}", resources["LoadFunction"]["Properties"]["Policies"]).contains("events/"));
    // The streams function serves GET /log: it reads the archive's objects and anchors, and writes neither.
    let statements = resources["StreamsFunction"]["Properties"]["Policies"][0]["Statement"].as_sequence().unwrap();
    let of_archive: Vec<&Value> =
        statements.iter().filter(|s| format!("{:?}", s["Resource"]).contains("/events/*")).collect();
    assert_eq!(of_archive.len(), 1, "{of_archive:?}");
    assert_eq!(strings(&of_archive[0]["Action"]), ["s3:GetObject"]);
    assert!(format!("{:?}", of_archive[0]["Resource"]).contains("${ArchiveBucket.Arn}/manifest/*"));
    // The bucket's name fits S3's 63 characters for the longest Service and Stage, in the longest region.
    let longest = |p: &str| template["Parameters"][p]["MaxLength"].as_u64().unwrap() as usize;
    let name = format!(
        "{}-{}-archive-{}-{}",
        "s".repeat(longest("Service")),
        "t".repeat(longest("Stage")),
        "0".repeat(12),
        "ap-southeast-2"
    );
    assert!(name.len() <= 63, "{name}: {} characters", name.len());
    for p in ["Service", "Stage"] {
        assert_eq!(
            template["Parameters"][p]["AllowedPattern"].as_str(),
            Some("[a-z0-9][a-z0-9-]*"),
            "S3 names are lowercase"
        );
    }
    assert_eq!(template["Parameters"]["HotRetentionDays"]["Default"].as_u64(), Some(30));
    for conditional in ["ArchiveFunction", "ArchiveDatabase", "ArchiveTable", "ArchiveErrorsAlarm"] {
        assert_eq!(resources[conditional]["Condition"].as_str(), Some("ArchiveEnabled"), "{conditional}");
    }
}

/// Every object the stack writes is written once (offloaded bodies under
/// their hash, archive objects, the manifest's anchors): so every role that may
/// put an object may do so only with `If-None-Match: *`, and none may replace
/// one (with old versions expiring, a replaced object would be gone a week later).
#[test]
fn every_object_put_is_write_once_in_iam() {
    let template = template();
    let mut puts = 0;
    for (name, resource) in template["Resources"].as_mapping().unwrap() {
        let policies = &resource["Properties"]["Policies"];
        let statements = policies
            .as_sequence()
            .into_iter()
            .flatten()
            .flat_map(|p| p["Statement"].as_sequence().cloned().unwrap_or_default());
        for statement in statements {
            if statement["Effect"].as_str() != Some("Allow")
                || !strings(&statement["Action"]).iter().any(|a| a.starts_with("s3:Put"))
            {
                continue;
            }
            puts += 1;
            assert_eq!(
                strings(&statement["Action"]),
                ["s3:PutObject"],
                "{name:?}: a put statement grants nothing else"
            );
            assert_eq!(
                statement["Condition"]["StringEquals"]["s3:if-none-match"].as_str(),
                Some("*"),
                "{name:?}: {statement:?} puts without If-None-Match"
            );
        }
    }
    assert_eq!(puts, 4, "load's and streams' payloads, the archiver's objects and anchors");
}

/// Every function logs to a group of the stack's own (Lambda's default
/// `/aws/lambda/<function>` already exists in stacks deployed before, and
/// declaring it would fail their update) kept `LogRetentionDays`, 30 by
/// default: stream names appear in the logs, and nothing personal is kept for ever.
#[test]
fn every_function_logs_to_its_own_group_with_a_retention() {
    let template = template();
    let resources = template["Resources"].as_mapping().unwrap();
    assert_eq!(template["Parameters"]["LogRetentionDays"]["Default"].as_u64(), Some(30));
    let mut functions = 0;
    for (name, resource) in resources {
        if resource["Type"].as_str() != Some("AWS::Serverless::Function") {
            continue;
        }
        functions += 1;
        let group = referenced(&resource["Properties"]["LoggingConfig"]["LogGroup"]).unwrap_or_default();
        let group_resource = &resources[group.as_str()];
        assert_eq!(group_resource["Type"].as_str(), Some("AWS::Logs::LogGroup"), "{name:?}: {group}");
        assert_eq!(referenced(&group_resource["Properties"]["RetentionInDays"]).as_deref(), Some("LogRetentionDays"));
        let group_name = sub_text(&group_resource["Properties"]["LogGroupName"]);
        assert!(group_name.starts_with("/event-store/${Service}-${Stage}/"), "{name:?}: {group_name}");
        assert_eq!(
            group_resource.get("Condition"),
            resource.get("Condition"),
            "{name:?}: exists when its function does"
        );
    }
    assert_eq!(functions, 10);
}

/// What the docs say a role may not do, evaluated against the template's
/// policies as AWS would (`event_store_emulator::iam`, `tests/iam/simulate.cjs`):
/// each is denied. (What each role's code does ask is allowed: checked on the
/// requests it really makes, in the integration tests of each stage.)
#[test]
fn each_role_writes_only_its_own_bookkeeping() {
    use event_store::bookkeeping::Family;
    use event_store_emulator::iam::{self, IamRequest, ACCOUNT, REGION};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let template = template();
    let stack = iam::Stack { service: "es".into(), stage: "ci".into(), physical: Default::default() };
    let table = format!("arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/es-ci-event-table");
    let owners = [
        ("ScanFunction", Family::Scan),
        ("PumpFunction", Family::Pump),
        ("ArchiveFunction", Family::Archive),
        ("PlaybackFunction", Family::Playbacks),
        ("SubscriptionsFunction", Family::Subscriptions),
    ];
    let mut cases = Vec::new();
    let mut expected = Vec::new();
    for (function, own) in owners {
        for (_, family) in owners {
            let keys = vec![family.slot().to_string()];
            let actions = ["UpdateItem", "PutItem", "DeleteItem", "BatchWriteItem", "ConditionCheckItem"];
            for action in actions.map(|a| format!("dynamodb:{a}")) {
                let request = IamRequest::new(&action, table.clone()).with("dynamodb:LeadingKeys", keys.clone());
                cases.push((iam::policies(&template, function, &stack), request));
                expected.push((function, action, family, family == own));
            }
        }
    }
    // IAM takes all of a batch's keys: events with the writer's own bookkeeping pass, with another's not.
    let batch = |function: &str, keys: &[&str]| {
        let keys = keys.iter().map(|k| k.to_string()).collect();
        let request = IamRequest::new("dynamodb:BatchWriteItem", table.clone()).with("dynamodb:LeadingKeys", keys);
        (iam::policies(&template, function, &stack), request)
    };
    let batches = [
        (batch("ScanFunction", &["1795000000000", "-2"]), true),
        (batch("ScanFunction", &["1795000000000", "-1", "-2"]), true),
        (batch("ScanFunction", &["1795000000000", "-4"]), false),
        (batch("ArchiveFunction", &["1795000000000", "-1", "-4"]), true),
        (batch("ArchiveFunction", &["1795000000000", "-2"]), false),
        (batch("SubscriptionsFunction", &["-6", "1795000000000"]), false),
        // A subscription partition's own key is the subscriptions' alone.
        (batch("SubscriptionsFunction", &["-600003", "-6"]), true),
        (batch("ScanFunction", &["-600003"]), false),
        (batch("ArchiveFunction", &["1795000000000", "-600003"]), false),
    ];
    let results = iam::evaluate(&root, &cases).unwrap();
    let mut wrong = Vec::new();
    for ((function, action, family, own), result) in expected.iter().zip(&results) {
        // A role may lack an action on its own family; it never has one on another's.
        if !own && result == "Allowed" {
            wrong.push(format!("{function} may {action} in {family:?}'s partition"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    let owned: Vec<String> = expected
        .iter()
        .zip(&results)
        .filter(|((_, _, _, own), r)| *own && *r == "Allowed")
        .map(|((function, action, _, _), _)| format!("{function} {action}"))
        .collect();
    let sent = [
        "ScanFunction dynamodb:UpdateItem",
        "ScanFunction dynamodb:BatchWriteItem",
        "PumpFunction dynamodb:UpdateItem",
        "PumpFunction dynamodb:PutItem",
        "ArchiveFunction dynamodb:UpdateItem",
        "ArchiveFunction dynamodb:PutItem",
        "ArchiveFunction dynamodb:BatchWriteItem",
        "PlaybackFunction dynamodb:UpdateItem",
        "PlaybackFunction dynamodb:PutItem",
        "SubscriptionsFunction dynamodb:UpdateItem",
        "SubscriptionsFunction dynamodb:PutItem",
        "SubscriptionsFunction dynamodb:DeleteItem",
        "SubscriptionsFunction dynamodb:BatchWriteItem",
        "SubscriptionsFunction dynamodb:ConditionCheckItem",
    ];
    assert_eq!(owned, sent, "each writes its own with the requests it sends");
    let (cases, wanted): (Vec<_>, Vec<bool>) = batches.into_iter().unzip();
    let results = iam::evaluate(&root, &cases).unwrap();
    assert_eq!(results.iter().map(|r| r == "Allowed").collect::<Vec<_>>(), wanted, "{results:?}");
}

#[test]
fn what_the_docs_say_a_role_may_not_do_is_denied() {
    use event_store_emulator::iam::{self, IamRequest, ACCOUNT, REGION};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let template = template();
    let stack = iam::Stack { service: "es".into(), stage: "ci".into(), physical: Default::default() };
    let table = |name: &str| format!("arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/es-ci-{name}");
    let object = |key: &str| format!("arn:aws:s3:::es-ci-archive-{ACCOUNT}-{REGION}/{key}");
    let keyed = |action: &str, arn: String, key: &str| {
        IamRequest::new(action, arn).with("dynamodb:LeadingKeys", vec![key.to_owned()])
    };
    let subject = "ab".repeat(32);
    let forbidden = [
        // Writers never write the key table: they ask the keys function, whose code only adds generations.
        ("LoadFunction", keyed("dynamodb:PutItem", table("key-table"), &subject)),
        ("StreamsFunction", keyed("dynamodb:UpdateItem", table("key-table"), &subject)),
        // Only the privacy function destroys keys; the keys function cannot delete one.
        ("KeysFunction", keyed("dynamodb:DeleteItem", table("key-table"), &subject)),
        // Ingest writes the event stream only: never the event table, nor the buffer.
        ("LoadFunction", keyed("dynamodb:PutItem", table("event-table"), "1795000000000")),
        ("LoadFunction", keyed("dynamodb:BatchWriteItem", table("buffer-table"), "abc")),
        // Readers read: they delete no object, put none, and write no event.
        ("PlaybackFunction", IamRequest::new("s3:DeleteObject", object("events/date=2026-11-28/hour=06/1.parquet"))),
        ("SubscriptionsFunction", IamRequest::new("s3:PutObject", object("events/date=2026-11-28/hour=06/1.parquet"))),
        ("PlaybackFunction", keyed("dynamodb:UpdateItem", table("event-table"), "1795000000000")),
        ("SubscriptionsFunction", keyed("dynamodb:PutItem", table("event-table"), "1795000000000")),
        // No role of the stack deletes an object or replaces one (write-once: only with If-None-Match).
        ("ArchiveFunction", IamRequest::new("s3:DeleteObject", object("events/date=2026-11-28/hour=06/1.parquet"))),
        ("ArchiveFunction", IamRequest::new("s3:PutObject", object("events/date=2026-11-28/hour=06/1.parquet"))),
        ("ArchiveFunction", IamRequest::new("s3:PutObject", object("manifest/000000000001.json"))),
        ("LoadFunction", IamRequest::new("s3:PutObject", object("payloads/sha256/ab"))),
        ("StreamsFunction", IamRequest::new("s3:PutObject", object("payloads/sha256/ab"))),
        // The archiver's single-item writes are the bookkeeping partition's (its BatchWriteItem, for
        // deletes and quarantine copies, cannot be narrowed by key: IAM takes all of a batch's keys).
        ("ArchiveFunction", keyed("dynamodb:PutItem", table("event-table"), "1795000000000")),
    ];
    let cases: Vec<_> = forbidden.iter().map(|(f, r)| (iam::policies(&template, f, &stack), r.clone())).collect();
    let results = iam::evaluate(&root, &cases).unwrap();
    for ((function, request), result) in forbidden.iter().zip(&results) {
        assert!(result.ends_with("Denied"), "{function} may {request:?}: {result}");
    }
    // The evaluation sees the difference: the same requests as the roles' own are allowed.
    let allowed = [
        (
            "LoadFunction",
            IamRequest::new("s3:PutObject", object("payloads/sha256/ab")).with("s3:if-none-match", vec!["*".into()]),
        ),
        ("ArchiveFunction", keyed("dynamodb:UpdateItem", table("event-table"), "-4")),
        ("PlaybackFunction", IamRequest::new("s3:GetObject", object("manifest/000000000001.json"))),
        // A missing anchor is a 404 to the archiver only if it may list the bucket (else a 403).
        ("ArchiveFunction", IamRequest::new("s3:ListBucket", format!("arn:aws:s3:::es-ci-archive-{ACCOUNT}-{REGION}"))),
    ];
    let cases: Vec<_> = allowed.iter().map(|(f, r)| (iam::policies(&template, f, &stack), r.clone())).collect();
    assert_eq!(iam::evaluate(&root, &cases).unwrap(), ["Allowed"; 4]);
}

#[test]
fn the_slices_parameter_offers_exactly_the_counts_the_scan_takes_and_is_off_by_default() {
    let template = template();
    let slices = &template["Parameters"]["Slices"];
    assert_eq!(slices["Default"].as_u64(), Some(1), "not cut by default: today's write units");
    let allowed: Vec<u32> =
        slices["AllowedValues"].as_sequence().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let taken: Vec<u32> = (0..=2048).filter(|n| event_store::config::check_slices(*n).is_ok()).collect();
    assert_eq!(allowed, taken);
    let env = &template["Resources"]["ScanFunction"]["Properties"]["Environment"]["Variables"];
    assert!(format!("{:?}", env["SLICES"]).contains("Slices"));
    // The stack's rule refuses what the scan refuses: Slices and SlotSubkeys both above 1.
    let rule = &template["Rules"]["SlicesOrSubkeys"]["Assertions"][0]["Assert"];
    for (slices, subkeys) in [(1, 1), (256, 1), (1, 8), (256, 8), (2, 2)] {
        let parameters = HashMap::from([("Slices", slices.to_string()), ("SlotSubkeys", subkeys.to_string())]);
        let refused = event_store::config::check_cut(slices, subkeys).is_err();
        assert_eq!(holds(rule, &parameters), !refused, "Slices {slices}, SlotSubkeys {subkeys}");
    }
}

/// A rule's assertion (`!Or`, `!Equals`, `!Ref` of parameters) evaluated as CloudFormation does.
fn holds(assertion: &Value, parameters: &HashMap<&str, String>) -> bool {
    let serde_yaml::Value::Tagged(tagged) = assertion else { panic!("not an intrinsic: {assertion:?}") };
    let args = tagged.value.as_sequence();
    let text = |v: &Value| match v {
        serde_yaml::Value::Tagged(t) if t.tag == "Ref" => parameters[t.value.as_str().unwrap()].clone(),
        other => other.as_str().map(str::to_owned).unwrap_or_else(|| format!("{}", other.as_u64().unwrap())),
    };
    match tagged.tag.to_string().trim_start_matches('!') {
        "Or" => args.unwrap().iter().any(|a| holds(a, parameters)),
        "Equals" => text(&args.unwrap()[0]) == text(&args.unwrap()[1]),
        other => panic!("an intrinsic the rule does not use: {other}"),
    }
}
