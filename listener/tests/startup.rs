//! Start-up wiring without a control plane: which addresses are bound, and which bind failures are fatal.

mod common;

use listener::{Config, Error, Listener};
use serde_json::{Value, json};

fn config(changes: Value) -> Config {
    let mut value = json!({
        "configure_url": "https://github.com/acme",
        "github_token": "ghp_test",
        "ephemeral_runner_set_namespace": "ns",
        "ephemeral_runner_set_name": "set",
        "max_runners": 5,
        "min_runners": 0,
        "runner_scale_set_id": 1,
        "log_level": "info",
        "log_format": "text",
        "metrics_addr": "127.0.0.1:0"
    });
    for (k, v) in changes.as_object().unwrap() {
        value[k] = v.clone();
    }
    let config = Config::decode(value.to_string().as_bytes()).unwrap();
    config.validate().unwrap();
    config
}

/// A client for an API server that is never contacted: start-up does no Kubernetes I/O.
fn kube_client() -> kube::Client {
    kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap()
}

#[tokio::test]
async fn metrics_and_health_share_an_address_or_use_their_own() {
    let listener = Listener::start(&config(json!({})), kube_client(), common::fast_settings())
        .await
        .unwrap();
    assert!(listener.metrics_addr().is_some());
    assert_eq!(listener.health_addr(), listener.metrics_addr());

    let listener = Listener::start(
        &config(json!({"health_addr": "127.0.0.1:0"})),
        kube_client(),
        common::fast_settings(),
    )
    .await
    .unwrap();
    assert!(listener.health_addr().is_some());
    assert_ne!(listener.health_addr(), listener.metrics_addr());

    let listener = Listener::start(
        &config(json!({"metrics_addr": "", "health_addr": ""})),
        kube_client(),
        common::fast_settings(),
    )
    .await
    .unwrap();
    assert_eq!(
        (listener.metrics_addr(), listener.health_addr()),
        (None, None)
    );
}

#[tokio::test]
async fn a_configured_address_in_use_is_fatal() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for changes in [json!({"metrics_addr": addr}), json!({"health_addr": addr})] {
        let result = Listener::start(
            &config(changes.clone()),
            kube_client(),
            common::fast_settings(),
        )
        .await;
        match result {
            Err(error @ Error::BindServer { .. }) => {
                assert_eq!(error.severity(), listener::Severity::Unrecoverable);
                assert!(error.to_string().contains(&addr), "{error}");
            }
            Err(other) => panic!("{changes}: unexpected error {other:?}"),
            Ok(_) => panic!("{changes}: started although the port is taken"),
        }
    }
}

#[tokio::test]
async fn the_default_health_address_in_use_is_not_fatal() {
    // Hold :8080 (if something else already does, the condition is the same).
    let _held = std::net::TcpListener::bind("0.0.0.0:8080");
    let _held_v6 = std::net::TcpListener::bind("[::]:8080");
    let listener = Listener::start(
        &config(json!({"metrics_addr": ""})),
        kube_client(),
        common::fast_settings(),
    )
    .await
    .expect("starts without the default health endpoint");
    assert_eq!(listener.metrics_addr(), None);
    assert_eq!(listener.health_addr(), None);
}
