use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::*;

/// A valid PAT config as the controller writes it.
fn base() -> Value {
    json!({
        "configure_url": "https://github.com/acme",
        "vault_type": "",
        "vault_lookup_key": "",
        "github_app_id": "",
        "github_app_installation_id": 0,
        "github_app_private_key": "",
        "github_token": "ghp_example",
        "ephemeral_runner_set_namespace": "arc-runners",
        "ephemeral_runner_set_name": "linux-x64-7f9c2",
        "max_runners": 2147483647,
        "min_runners": 1,
        "runner_scale_set_id": 17,
        "runner_scale_set_name": "linux-x64",
        "server_root_ca": "",
        "log_level": "debug",
        "log_format": "text",
        "metrics_addr": ":8080",
        "metrics_endpoint": "/metrics",
        "metrics": null
    })
}

fn with(changes: Value) -> Value {
    let mut value = base();
    for (k, v) in changes.as_object().unwrap() {
        value[k] = v.clone();
    }
    value
}

fn without(keys: &[&str]) -> Value {
    let mut value = base();
    for key in keys {
        value.as_object_mut().unwrap().remove(*key);
    }
    value
}

fn check(value: &Value) -> Result<Config> {
    let config = Config::decode(value.to_string().as_bytes())?;
    config.validate()?;
    Ok(config)
}

fn problem(value: &Value) -> ConfigProblem {
    match check(value) {
        Err(Error::ValidateConfig(problem)) => problem,
        other => panic!("expected a validation error for {value}, got {other:?}"),
    }
}

fn message(value: &Value) -> String {
    check(value).unwrap_err().to_string()
}

#[test]
fn the_controllers_config_is_valid() {
    let config = check(&base()).expect("valid");
    assert_eq!(config.runner_scale_set_id, 17);
    assert_eq!(config.max_runners, 2_147_483_647);
    assert_eq!(config.log_level().unwrap(), LogLevel::Debug);
    assert_eq!(config.log_format().unwrap(), LogFormat::Text);
    assert!(matches!(config.credentials().unwrap(), Credentials::Pat(_)));
    assert_eq!(config.metrics_path(), "/metrics");
    assert_eq!(config.health_address(), Some(":8080"));
    assert!(config.credential_keys_present);
}

#[test]
fn go_decoding_leniency() {
    // Trailing bytes after the first value, unknown keys, other key case, nulls.
    let mut text = with(json!({"unknown": 1, "min_runners": null})).to_string();
    text.push_str(" trailing garbage {");
    let config = Config::decode(text.as_bytes()).expect("decodes");
    assert_eq!(config.min_runners, 0);
    let mut upper = base();
    let object = upper.as_object_mut().unwrap();
    let url = object.remove("configure_url").unwrap();
    object.insert("Configure_URL".into(), url);
    assert_eq!(
        Config::decode(upper.to_string().as_bytes())
            .unwrap()
            .configure_url,
        "https://github.com/acme"
    );
    // The exact spelling wins over a case variant.
    let mut both = base();
    both["CONFIGURE_URL"] = json!("https://github.com/other");
    assert_eq!(
        Config::decode(both.to_string().as_bytes())
            .unwrap()
            .configure_url,
        "https://github.com/acme"
    );
}

#[test]
fn decoding_errors() {
    assert!(matches!(
        Config::decode(b""),
        Err(Error::ValidateConfig(ConfigProblem::Empty))
    ));
    assert!(matches!(
        Config::decode(b"[1]"),
        Err(Error::ValidateConfig(ConfigProblem::NotAnObject))
    ));
    assert!(matches!(Config::decode(b"{"), Err(Error::DecodeConfig(_))));
    let wrong_type = with(json!({"max_runners": "10"})).to_string();
    let err = Config::decode(wrong_type.as_bytes()).unwrap_err();
    assert!(matches!(err, Error::DecodeConfig(_)), "{err:?}");
    let fractional = with(json!({"runner_scale_set_id": 1.5})).to_string();
    assert!(matches!(
        Config::decode(fractional.as_bytes()),
        Err(Error::DecodeConfig(_))
    ));
}

/// The decoding error of `value`, as the binary prints it after "listener: ".
fn decode_message(value: &Value) -> String {
    match Config::decode(value.to_string().as_bytes()) {
        Err(error @ Error::DecodeConfig(_)) => error.to_string(),
        other => panic!("expected a decoding error for {value}, got {other:?}"),
    }
}

#[test]
fn decoding_errors_name_the_key() {
    let cases = [
        (
            with(json!({"max_runners": "10"})),
            "max_runners: invalid type: string \"10\", expected i64",
        ),
        (
            with(json!({"runner_scale_set_id": 1.5})),
            "runner_scale_set_id: invalid type: floating point `1.5`, expected i64",
        ),
        (
            with(json!({"log_level": ["debug"]})),
            "log_level: invalid type: sequence, expected a string",
        ),
        // Keys matched case-insensitively are reported under their canonical name.
        (
            {
                let mut value = without(&["min_runners"]);
                value["MIN_RUNNERS"] = json!(true);
                value
            },
            "min_runners: invalid type: boolean `true`, expected i64",
        ),
        // Nested values: the deepest wrongly typed one, with its path.
        (
            with(json!({"azure_key_vault": {"url": "https://vault", "proxy": {"cgi": "yes"}}})),
            "azure_key_vault.proxy.cgi: invalid type: string \"yes\", expected a boolean",
        ),
        (
            with(
                json!({"metrics": {"histograms": {"gha_job_startup_duration_seconds": {
                "labels": ["name"], "buckets": [0.5, 1, "2"]}}}}),
            ),
            "metrics.histograms.gha_job_startup_duration_seconds.buckets[2]: invalid type: string \"2\", \
             expected f64",
        ),
        (
            with(json!({"metrics": {"counters": []}})),
            "metrics.counters: invalid type: sequence, expected a map",
        ),
    ];
    for (value, expected) in cases {
        assert_eq!(
            decode_message(&value),
            format!("decoding the config file failed: {expected}")
        );
    }
}

#[test]
fn decoding_errors_never_repeat_a_secret() {
    for (key, value, kind) in [
        ("github_token", json!(4_815_162_342_u64), "integer"),
        ("github_token", json!(true), "boolean"),
        ("github_app_private_key", json!(12.5), "floating point"),
        ("github_app_private_key", json!(["-----BEGIN"]), "sequence"),
    ] {
        let message = decode_message(&with(json!({ key: value })));
        assert_eq!(
            message,
            format!(
                "decoding the config file failed: {key}: invalid type: {kind}, expected a string"
            )
        );
    }
}

#[test]
fn every_problem_and_its_message() {
    let cases: Vec<(Value, ConfigProblem, &str)> = vec![
        (
            with(json!({"vault_type": "hashicorp"})),
            ConfigProblem::UnsupportedVaultType("hashicorp".into()),
            "invalid config: vault_type \"hashicorp\" is not supported; use \"\" (credentials in this file) or \"azure_key_vault\"",
        ),
        (
            with(json!({"vault_type": "azure_key_vault", "vault_lookup_key": "k"})),
            ConfigProblem::MissingAzureKeyVault,
            "invalid config: azure_key_vault is required when vault_type is \"azure_key_vault\"",
        ),
        (
            with(json!({"configure_url": ""})),
            ConfigProblem::MissingConfigureUrl,
            "invalid config: configure_url is required",
        ),
        (
            with(json!({"ephemeral_runner_set_namespace": ""})),
            ConfigProblem::MissingRunnerSetNamespace,
            "invalid config: ephemeral_runner_set_namespace is required",
        ),
        (
            with(json!({"ephemeral_runner_set_name": ""})),
            ConfigProblem::MissingRunnerSetName,
            "invalid config: ephemeral_runner_set_name is required",
        ),
        (
            with(json!({"runner_scale_set_id": 0})),
            ConfigProblem::MissingScaleSetId,
            "invalid config: runner_scale_set_id is required (it is 0)",
        ),
        (
            with(json!({"min_runners": 5, "max_runners": 4})),
            ConfigProblem::MaxBelowMin { min: 5, max: 4 },
            "invalid config: max_runners (4) must be greater than or equal to min_runners (5)",
        ),
        (
            without(&[
                "github_token",
                "github_app_id",
                "github_app_installation_id",
                "github_app_private_key",
            ]),
            ConfigProblem::MissingCredentials,
            "invalid config: no credentials: set github_token, or github_app_id, github_app_installation_id and \
             github_app_private_key",
        ),
        (
            with(json!({"github_app_id": "1", "github_app_installation_id": 2, "github_app_private_key": "pem"})),
            ConfigProblem::BothCredentials,
            "invalid config: both github_token and complete GitHub App credentials are set; set only one kind",
        ),
        (
            with(json!({"github_token": "", "github_app_id": "1", "github_app_private_key": "pem"})),
            ConfigProblem::NoCompleteCredentials,
            "invalid config: no usable credentials: github_token is empty and the GitHub App credentials are \
             incomplete (github_app_id, github_app_installation_id > 0 and github_app_private_key are all required)",
        ),
        (
            with(json!({"configure_url": "https://github.com/a/b/c"})),
            ConfigProblem::InvalidConfigureUrl(
                "parsing the GitHub config URL \"https://github.com/a/b/c\" failed: invalid config URL, should \
                 point to an enterprise, org, or repository"
                    .into(),
            ),
            "invalid config: configure_url: parsing the GitHub config URL \"https://github.com/a/b/c\" failed: \
             invalid config URL, should point to an enterprise, org, or repository",
        ),
        (
            with(json!({"log_level": ""})),
            ConfigProblem::InvalidLogLevel(String::new()),
            "invalid config: log_level \"\" is not one of debug, info, warn, error",
        ),
        (
            with(json!({"log_level": "trace"})),
            ConfigProblem::InvalidLogLevel("trace".into()),
            "invalid config: log_level \"trace\" is not one of debug, info, warn, error",
        ),
        (
            with(json!({"log_format": "JSON"})),
            ConfigProblem::InvalidLogFormat("JSON".into()),
            "invalid config: log_format \"JSON\" is not one of json, text",
        ),
        (
            with(json!({"metrics_endpoint": "metrics"})),
            ConfigProblem::InvalidMetricsEndpoint("metrics".into()),
            "invalid config: metrics_endpoint \"metrics\" must be a path starting with \"/\"",
        ),
        (
            with(json!({"metrics_endpoint": "/healthz"})),
            ConfigProblem::MetricsEndpointIsHealthPath,
            "invalid config: metrics_endpoint must not be \"/healthz\" when metrics and health share an address",
        ),
        (
            with(json!({"metrics": {"gauges": {"gha_assigned_jobs": null}}})),
            ConfigProblem::InvalidMetricSelection {
                kind: "gauges",
                name: "gha_assigned_jobs".into(),
                problem: "the entry is null; use {\"labels\": [...]} (an empty list for no labels)".into(),
            },
            "invalid config: metrics.gauges.gha_assigned_jobs: the entry is null; use {\"labels\": [...]} (an \
             empty list for no labels)",
        ),
        (
            with(json!({"max_runners": 2_147_483_648_i64})),
            ConfigProblem::MaxRunnersOutOfRange(2_147_483_648),
            "invalid config: max_runners (2147483648) must be between 0 and 2147483647",
        ),
        (
            with(json!({"min_runners": -5, "max_runners": -1})),
            ConfigProblem::MaxRunnersOutOfRange(-1),
            "invalid config: max_runners (-1) must be between 0 and 2147483647",
        ),
    ];
    for (value, expected, text) in cases {
        assert_eq!(problem(&value), expected, "{value}");
        assert_eq!(message(&value), text);
    }
}

#[test]
fn checks_run_in_the_reference_order() {
    // Everything wrong at once: the vault type is reported first, then the URL, then the names...
    let all_wrong =
        json!({"vault_type": "x", "runner_scale_set_id": 0, "max_runners": -1, "min_runners": 0});
    assert_eq!(
        problem(&all_wrong),
        ConfigProblem::UnsupportedVaultType("x".into())
    );
    let no_vault = json!({"runner_scale_set_id": 0, "max_runners": -1, "log_level": "x"});
    assert_eq!(problem(&no_vault), ConfigProblem::MissingConfigureUrl);
    let names_then_id = json!({"configure_url": "https://github.com/a", "runner_scale_set_id": 0});
    assert_eq!(
        problem(&names_then_id),
        ConfigProblem::MissingRunnerSetNamespace
    );
    let id_before_bounds =
        with(json!({"runner_scale_set_id": 0, "min_runners": 3, "max_runners": 1}));
    assert_eq!(problem(&id_before_bounds), ConfigProblem::MissingScaleSetId);
    let bounds_before_credentials =
        with(json!({"github_token": "", "min_runners": 3, "max_runners": 1}));
    assert_eq!(
        problem(&bounds_before_credentials),
        ConfigProblem::MaxBelowMin { min: 3, max: 1 }
    );
    let credentials_before_url = with(json!({"github_token": "", "configure_url": "not a url"}));
    assert_eq!(
        problem(&credentials_before_url),
        ConfigProblem::NoCompleteCredentials
    );
    let level_before_format = with(json!({"log_level": "", "log_format": ""}));
    assert_eq!(
        problem(&level_before_format),
        ConfigProblem::InvalidLogLevel(String::new())
    );
}

#[test]
fn azure_key_vault_settings_are_checked_and_replace_inline_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    std::fs::write(&cert, "pem").unwrap();
    let vault = |changes: Value| {
        let mut akv = json!({
            "tenant_id": "t", "client_id": "c", "url": "https://vault.example", "certificate_path": cert.to_str().unwrap()
        });
        for (k, v) in changes.as_object().unwrap() {
            akv[k] = v.clone();
        }
        without(&[
            "github_token",
            "github_app_id",
            "github_app_installation_id",
            "github_app_private_key",
        ])
        .as_object()
        .unwrap()
        .clone()
        .into_iter()
        .chain([
            ("vault_type".to_owned(), json!("azure_key_vault")),
            ("vault_lookup_key".to_owned(), json!("creds")),
            ("azure_key_vault".to_owned(), akv),
        ])
        .collect::<serde_json::Map<_, _>>()
        .into()
    };
    let azure = |text: &str| ConfigProblem::InvalidAzureKeyVault(text.to_owned());
    assert_eq!(
        problem(&vault(json!({"tenant_id": ""}))),
        azure("tenant_id is required")
    );
    assert_eq!(
        problem(&vault(json!({"client_id": ""}))),
        azure("client_id is required")
    );
    assert_eq!(
        problem(&vault(json!({"url": "vault"}))),
        azure("url \"vault\" is not an absolute URL")
    );
    assert_eq!(
        problem(&vault(json!({"certificate_path": ""}))),
        azure("certificate_path is required")
    );
    let missing = dir.path().join("missing.pem");
    match problem(&vault(
        json!({"certificate_path": missing.to_str().unwrap()}),
    )) {
        ConfigProblem::InvalidAzureKeyVault(text) => {
            assert!(text.contains("cannot be read"), "{text}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        problem(&vault(json!({"proxy": {}}))),
        azure("proxy is set but all of its fields are empty")
    );
    // Valid settings pass without inline credentials: the secret is read from the vault at start-up.
    let config = check(&vault(
        json!({"proxy": {"HTTPSProxy": "http://proxy:3128"}}),
    ))
    .expect("valid vault settings");
    assert_eq!(config.vault_lookup_key, "creds");
    assert!(check(&vault(json!({}))).is_ok());
    // A vault type without a lookup key: the vault object is checked first, as in ARC, then the key.
    let mut no_key = vault(json!({}));
    no_key["vault_lookup_key"] = json!("");
    assert_eq!(problem(&no_key), ConfigProblem::MissingVaultLookupKey);
    let mut no_key_bad_vault = vault(json!({"tenant_id": ""}));
    no_key_bad_vault["vault_lookup_key"] = json!("");
    assert_eq!(problem(&no_key_bad_vault), azure("tenant_id is required"));
}

#[test]
fn credential_selection() {
    let app = with(
        json!({"github_token": "", "github_app_id": "Iv1.x", "github_app_installation_id": 5, "github_app_private_key": "pem"}),
    );
    match check(&app).unwrap().credentials().unwrap() {
        Credentials::App(app) => {
            assert_eq!((app.client_id.as_str(), app.installation_id), ("Iv1.x", 5));
        }
        Credentials::Pat(_) => panic!("expected App credentials"),
    }
    // A PAT next to a partial App triple is a PAT.
    let partial = with(json!({"github_app_id": "1"}));
    assert!(matches!(
        check(&partial).unwrap().credentials().unwrap(),
        Credentials::Pat(_)
    ));
    // A negative installation id makes the triple incomplete.
    let negative = with(
        json!({"github_token": "", "github_app_id": "1", "github_app_installation_id": -1, "github_app_private_key": "pem"}),
    );
    assert_eq!(problem(&negative), ConfigProblem::NoCompleteCredentials);
}

#[test]
fn accepted_edge_values() {
    // Negative min and negative ids pass, as in ARC; log level is case-insensitive.
    let config = check(&with(
        json!({"min_runners": -2, "max_runners": 0, "runner_scale_set_id": -4, "log_level": "WARN", "log_format": "json"}),
    ))
    .expect("valid");
    assert_eq!(config.log_level().unwrap(), LogLevel::Warn);
    assert_eq!(config.log_format().unwrap(), LogFormat::Json);
    // Metrics off: the endpoint is not checked, and health moves to its default address.
    let config = check(&with(
        json!({"metrics_addr": "", "metrics_endpoint": "nonsense"}),
    ))
    .expect("valid");
    assert!(!config.metrics_enabled());
    assert_eq!(config.health_address(), Some(DEFAULT_HEALTH_ADDR));
    // An explicit health address, and an empty one that disables health.
    let config = check(&with(
        json!({"health_addr": "127.0.0.1:9000", "metrics_endpoint": "/healthz"}),
    ))
    .expect("valid");
    assert_eq!(config.health_address(), Some("127.0.0.1:9000"));
    let config = check(&with(json!({"health_addr": ""}))).expect("valid");
    assert_eq!(config.health_address(), None);
    // An empty endpoint means /metrics; `{}` selects no ARC metric at all.
    let config = check(&with(json!({"metrics_endpoint": "", "metrics": {}}))).expect("valid");
    assert_eq!(config.metrics_path(), "/metrics");
    assert_eq!(config.metrics, Some(MetricsSelection::default()));
}

#[test]
fn load_reads_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, base().to_string()).unwrap();
    assert_eq!(
        Config::load(&path).unwrap().ephemeral_runner_set_name,
        "linux-x64-7f9c2"
    );
    let missing = dir.path().join("nope.json");
    let err = Config::load(&missing).unwrap_err();
    assert!(matches!(err, Error::ReadConfig { .. }), "{err:?}");
    assert!(err.to_string().contains("nope.json"), "{err}");
}

#[test]
fn debug_output_hides_secrets() {
    let config = check(&with(json!({"github_token": "ghp_supersecret"}))).unwrap();
    let shown = format!("{config:?}");
    assert!(!shown.contains("supersecret"), "{shown}");
    assert!(shown.contains("<redacted>"));
}

#[test]
fn the_status_target_needs_both_variables() {
    let some = |s: &str| Some(s.to_owned());
    assert_eq!(
        super::status_target(some("l"), some("arc")).unwrap(),
        Some(super::StatusTarget {
            namespace: "arc".into(),
            name: "l".into()
        })
    );
    assert_eq!(super::status_target(None, None).unwrap(), None);
    for (name, namespace) in [(some("l"), None), (None, some("arc"))] {
        let err = super::status_target(name, namespace).unwrap_err();
        assert!(err.to_string().contains("must be set together"), "{err}");
    }
}

#[test]
fn schedules_and_delay_are_read_and_checked() {
    let config = check(&with(json!({
        "min_runners_schedules": [{"name": "office", "minRunners": 3, "start": "09:00", "end": "17:00",
            "recurrence": "weekdays", "timeZone": "Europe/Berlin"}],
        "scale_down_delay_seconds": 300
    })))
    .expect("valid");
    assert_eq!(config.schedules().unwrap()[0].name, "office");
    assert_eq!(
        config.scale_down_delay(),
        std::time::Duration::from_secs(300)
    );
    // Absent: ARC's behaviour.
    let plain = check(&base()).unwrap();
    assert!(plain.min_runners_schedules.is_empty());
    assert_eq!(plain.scale_down_delay(), std::time::Duration::ZERO);

    assert_eq!(
        message(&with(
            json!({"min_runners_schedules": [{"minRunners": 1, "start": "09:00", "end": "10:00", "timeZone": "Mars/Base"}]})
        )),
        "invalid config: minRunnersSchedules \"schedule-1\": timeZone \"Mars/Base\" is not an IANA time zone known here (e.g. Europe/Berlin)"
    );
    assert_eq!(
        problem(&with(
            json!({"max_runners": 2, "min_runners": 0, "min_runners_schedules": [{"minRunners": 3, "start": "09:00", "duration": "1h"}]})
        )),
        ConfigProblem::InvalidSchedule(
            "minRunnersSchedules \"schedule-1\": minRunners (3) is greater than maxRunners (2)"
                .to_owned()
        )
    );
    assert_eq!(
        problem(&with(json!({"scale_down_delay_seconds": -1}))),
        ConfigProblem::ScaleDownDelayOutOfRange(-1)
    );
    assert_eq!(
        problem(&with(json!({"scale_down_delay_seconds": 86_401}))),
        ConfigProblem::ScaleDownDelayOutOfRange(86_401)
    );
}
