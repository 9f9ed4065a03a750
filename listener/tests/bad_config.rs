//! The listener binary with bad configuration: every case exits with status 1 before any network call, prints
//! exactly one precise `listener: ...` line on stderr, and never echoes a credential from the file.
//!
//! The binary is run as the controller runs it (only `LISTENER_CONFIG_PATH` set, plus a kubeconfig for an API
//! server that is never contacted, since the listener infers its Kubernetes configuration before it builds the
//! Actions client and binds its ports).

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The token in every valid-looking config; it must never appear in the output.
const TOKEN: &str = "ghp_bad_config_secret_0123456789";

/// A kubeconfig for a port nothing listens on: enough for start-up, which makes no Kubernetes call.
const KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]
users: [{name: u, user: {}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
";

/// A config that would pass validation; each case changes some of it.
fn valid() -> Value {
    json!({
        "configure_url": "https://github.com/acme",
        "github_token": TOKEN,
        "ephemeral_runner_set_namespace": "ns",
        "ephemeral_runner_set_name": "set",
        "max_runners": 5,
        "min_runners": 0,
        "runner_scale_set_id": 1,
        "log_level": "info",
        "log_format": "text",
        "metrics_addr": "",
        "health_addr": ""
    })
}

fn with(changes: Value) -> Value {
    let mut value = valid();
    for (key, change) in changes.as_object().expect("an object") {
        value[key] = change.clone();
    }
    value
}

/// Runs the binary with `path` as its config (or none), with a deadline so a listener that does not exit fails
/// the test instead of hanging it.
fn run(path: Option<&Path>) -> Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, KUBECONFIG).expect("write the kubeconfig");
    let mut command = Command::new(env!("CARGO_BIN_EXE_listener"));
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBECONFIG", &kubeconfig)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(path) = path {
        command.env("LISTENER_CONFIG_PATH", path);
    }
    let mut child = command.spawn().expect("spawn the listener");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            child.kill().ok();
            let output = child.wait_with_output().expect("output");
            panic!(
                "the listener did not exit within 30 s; stderr: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes `contents` to a temporary config file and runs the binary on it.
fn run_with(contents: &[u8]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.json");
    std::fs::write(&path, contents).expect("write the config");
    (run(Some(&path)), dir)
}

/// Exit status 1, stderr is exactly `expected` (one line), no credential in stdout or stderr.
fn assert_fails(output: &Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.trim_end(), expected);
    for text in [&stderr, &stdout] {
        assert!(!text.contains(TOKEN), "the token leaked: {text}");
        assert!(
            !text.contains("PRIVATE KEY"),
            "the private key leaked: {text}"
        );
    }
}

fn assert_config_fails(config: Value, expected: &str) {
    let (output, _dir) = run_with(config.to_string().as_bytes());
    assert_fails(&output, expected);
}

#[test]
fn no_config_path() {
    assert_fails(
        &run(None),
        "listener: the environment variable LISTENER_CONFIG_PATH is not set; it must name the JSON config file",
    );
}

#[test]
fn a_config_file_that_does_not_exist() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("missing.json");
    assert_fails(
        &run(Some(&path)),
        &format!(
            "listener: reading the config file {} failed: No such file or directory (os error 2)",
            path.display()
        ),
    );
}

#[test]
fn an_empty_config_file() {
    let (output, _dir) = run_with(b"");
    assert_fails(
        &output,
        "listener: invalid config: the config file contains no JSON value",
    );
}

#[test]
fn malformed_json() {
    let (output, _dir) = run_with(format!("{{\"github_token\": \"{TOKEN}\", ").as_bytes());
    assert_fails(
        &output,
        "listener: decoding the config file failed: EOF while parsing a value at line 1 column 53",
    );
}

#[test]
fn a_config_that_is_not_an_object() {
    let (output, _dir) = run_with(b"[1, 2]");
    assert_fails(
        &output,
        "listener: invalid config: the config file must contain a JSON object",
    );
}

/// Go's decoder names the field ("cannot unmarshal string into Go struct field Config.max_runners"); without it
/// the user has to guess which of the numbers is wrong.
#[test]
fn a_string_where_a_number_belongs() {
    assert_config_fails(
        with(json!({"max_runners": "5"})),
        "listener: decoding the config file failed: max_runners: invalid type: string \"5\", expected i64",
    );
}

/// A token of the wrong type is named but not printed.
#[test]
fn a_token_that_is_not_a_string() {
    assert_config_fails(
        with(json!({"github_token": 4_815_162_342_u64})),
        "listener: decoding the config file failed: github_token: invalid type: integer, expected a string",
    );
}

#[test]
fn a_wrongly_typed_nested_value() {
    assert_config_fails(
        with(json!({"metrics": {"counters": {"gha_started_jobs_total": {"labels": "name"}}}})),
        "listener: decoding the config file failed: metrics.counters.gha_started_jobs_total.labels: invalid \
         type: string \"name\", expected a sequence",
    );
}

#[test]
fn no_configure_url() {
    assert_config_fails(
        with(json!({"configure_url": ""})),
        "listener: invalid config: configure_url is required",
    );
}

#[test]
fn a_malformed_configure_url() {
    assert_config_fails(
        with(json!({"configure_url": "not a url"})),
        "listener: invalid config: configure_url: parsing the GitHub config URL \"not a url\" failed: \
         not a URL: relative URL without a base",
    );
}

#[test]
fn no_runner_set_name() {
    assert_config_fails(
        with(json!({"ephemeral_runner_set_name": ""})),
        "listener: invalid config: ephemeral_runner_set_name is required",
    );
}

#[test]
fn scale_set_id_zero() {
    assert_config_fails(
        with(json!({"runner_scale_set_id": 0})),
        "listener: invalid config: runner_scale_set_id is required (it is 0)",
    );
}

#[test]
fn min_runners_above_max_runners() {
    assert_config_fails(
        with(json!({"min_runners": 5, "max_runners": 4})),
        "listener: invalid config: max_runners (4) must be greater than or equal to min_runners (5)",
    );
}

#[test]
fn max_runners_beyond_int32() {
    assert_config_fails(
        with(json!({"max_runners": 2_147_483_648_i64})),
        "listener: invalid config: max_runners (2147483648) must be between 0 and 2147483647",
    );
}

#[test]
fn no_credentials() {
    assert_config_fails(
        with(json!({"github_token": null})),
        "listener: invalid config: no credentials: set github_token, or github_app_id, \
         github_app_installation_id and github_app_private_key",
    );
}

#[test]
fn a_token_and_an_app_both_set() {
    assert_config_fails(
        with(json!({
            "github_app_id": "123",
            "github_app_installation_id": 456,
            "github_app_private_key": "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n",
        })),
        "listener: invalid config: both github_token and complete GitHub App credentials are set; set only one kind",
    );
}

#[test]
fn a_malformed_private_key() {
    assert_config_fails(
        with(json!({
            "github_token": null,
            "github_app_id": "123",
            "github_app_installation_id": 456,
            "github_app_private_key": "-----BEGIN RSA PRIVATE KEY-----\nnot base64!\n-----END RSA PRIVATE KEY-----\n",
        })),
        "listener: building the GitHub Actions client failed: loading the GitHub App private key failed: \
         the PEM block's body is not valid base64",
    );
}

#[test]
fn a_root_ca_that_is_not_pem() {
    assert_config_fails(
        with(json!({"server_root_ca": "this is not a certificate"})),
        "listener: building the GitHub Actions client failed: loading the root CA bundle failed: the PEM \
         bundle contains no certificate",
    );
}

#[test]
fn an_unknown_log_level() {
    assert_config_fails(
        with(json!({"log_level": "verbose"})),
        "listener: invalid config: log_level \"verbose\" is not one of debug, info, warn, error",
    );
}

#[test]
fn an_unknown_vault_type() {
    assert_config_fails(
        with(json!({"vault_type": "hashicorp"})),
        "listener: invalid config: vault_type \"hashicorp\" is not supported; use \"\" (credentials in this \
         file) or \"azure_key_vault\"",
    );
}

#[test]
fn a_metrics_endpoint_without_a_slash() {
    assert_config_fails(
        with(json!({"metrics_addr": "127.0.0.1:0", "metrics_endpoint": "metrics"})),
        "listener: invalid config: metrics_endpoint \"metrics\" must be a path starting with \"/\"",
    );
}

#[test]
fn a_metrics_address_that_cannot_be_bound() {
    assert_config_fails(
        with(json!({"metrics_addr": "192.0.2.1:1"})),
        "listener: binding the metrics server to \"192.0.2.1:1\" failed: Cannot assign requested address \
         (os error 99)",
    );
}
