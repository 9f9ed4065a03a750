//! The manager accepts every argument list the controller chart renders: the chart and the binary's flags cannot
//! drift apart. Renders with the real helm and parses with the manager's own clap definition.

use chart_tests::{Chart, Template};
use clap::Parser;
use controller::cli::Args;
use controller::options::ListenerMode;
use serde_json::{Value, json};

fn manager_args(template: Template) -> Vec<String> {
    let manifests = template
        .release("arc")
        .namespace("arc-systems")
        .render()
        .unwrap_or_else(|e| panic!("render failed: {e}"));
    let deployment = manifests
        .get("Deployment", "arc-gha-rs-controller")
        .expect("manager Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mut args = vec!["manager".to_owned()];
    args.extend(
        container["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string arg").to_owned()),
    );
    args
}

fn parse(args: &[String]) -> Args {
    Args::try_parse_from(args).unwrap_or_else(|e| panic!("the manager rejects {args:?}: {e}"))
}

#[test]
fn the_default_render_parses_and_does_not_throttle() {
    let args = parse(&manager_args(Template::new(Chart::Controller)));
    assert_eq!(args.options().runner_concurrency, 64);
    assert!(!args.enable_leader_election);
    assert!(args.options().protect_busy_runners);
}

#[test]
fn busy_runners_are_protected_unless_the_values_say_false() {
    for (value, protected) in [
        (json!(true), true),
        (json!(false), false),
        (Value::Null, true),
    ] {
        let rendered = manager_args(
            Template::new(Chart::Controller)
                .values(json!({"flags": {"protectBusyRunners": value}})),
        );
        assert_eq!(
            parse(&rendered).options().protect_busy_runners,
            protected,
            "flags.protectBusyRunners = {value}: {rendered:?}"
        );
    }
}

#[test]
fn a_render_with_every_flag_parses() {
    let values: Value = json!({
        "replicaCount": 2,
        "imagePullSecrets": [{"name": "regcred"}],
        "flags": {
            "logLevel": "info",
            "logFormat": "json",
            "watchSingleNamespace": "runners",
            "runnerMaxConcurrentReconciles": 8,
            "updateStrategy": "eventual",
            "excludeLabelPropagationPrefixes": ["argocd.argoproj.io/", "internal.example/"],
            "k8sClientRateLimiterQPS": 50,
            "k8sClientRateLimiterBurst": 75,
            "k8sClientMaxInFlight": 0,
            "rateLimiter": {"name": "typed_rate_limiter"},
            "healthProbeBindAddress": ":8081",
            "listenerMode": "manager"
        },
        "metrics": {"controllerManagerAddr": ":8080", "listenerAddr": ":8080", "listenerEndpoint": "/metrics"},
        "pprof": {"addr": ":6060"}
    });
    let rendered = manager_args(Template::new(Chart::Controller).values(values));
    let args = parse(&rendered);
    let options = args.options();
    assert!(args.enable_leader_election, "{rendered:?}");
    assert_eq!(options.watch_namespace.as_deref(), Some("runners"));
    assert_eq!(options.runner_concurrency, 8);
    assert_eq!(options.exclude_label_propagation_prefixes.len(), 2);
    assert_eq!(args.k8s_client_rate_limiter_burst, 75);
    assert_eq!(args.k8s_client_rate_limiter_qps, 50.0);
    assert_eq!(
        args.k8s_client_max_in_flight, 0,
        "0 (no limit) is passed, not dropped"
    );
    assert_eq!(options.listener.metrics_endpoint, "/metrics");
    assert_eq!(options.listener.mode, ListenerMode::Manager);
}

#[test]
fn listeners_run_in_pods_unless_the_values_say_manager_and_nothing_else_renders() {
    let mode = |value: Value| {
        Template::new(Chart::Controller)
            .values(json!({"flags": {"listenerMode": value}}))
            .release("arc")
            .namespace("arc-systems")
            .render()
            .map(|_| {
                let values = json!({"flags": {"listenerMode": value}});
                parse(&manager_args(
                    Template::new(Chart::Controller).values(values),
                ))
                .options()
                .listener
                .mode
            })
    };
    assert_eq!(mode(Value::Null).unwrap(), ListenerMode::Pod);
    assert_eq!(mode(json!("pod")).unwrap(), ListenerMode::Pod);
    assert_eq!(mode(json!("manager")).unwrap(), ListenerMode::Manager);
    let refused = mode(json!("pods")).expect_err("an unknown mode fails the render");
    assert!(
        refused.to_string().contains("flags.listenerMode must be"),
        "{refused}"
    );
}
