//! Transport behaviour against tiny scripted servers: retries, Retry-After, deadlines, request shapes, the
//! admin-token cache, TLS roots and proxies.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actions_client::{
    ErrorKind, JitSetting, ProxyConfig, ProxyServer, ProxySettings, RunnerScaleSet, SecretString,
    Timeouts, TlsRoots,
};
use base64::Engine as _;
use common::{
    MockServer, Recorded, Reply, TestPki, admin_jwt, pat_client, start_proxy, start_tls_server,
    test_options,
};
use pretty_assertions::assert_eq;

const SCALE_SETS: &str = "/tenant/1/_apis/runtime/runnerscalesets";

fn empty_list() -> Reply {
    Reply::json(200, r#"{"count":0,"value":[]}"#)
}

fn token() -> SecretString {
    SecretString::new("mq-token")
}

#[tokio::test]
async fn transient_statuses_are_retried_until_attempts_run_out() {
    let server =
        MockServer::start(|r, _| (r.path() == SCALE_SETS).then(|| Reply::json(503, "{}"))).await;
    let client = pat_client(&server.org_url(), test_options(3));
    let err = client
        .get_runner_scale_set(1, "set")
        .await
        .expect_err("503 forever");
    assert_eq!(
        server.requests_to("/runnerscalesets").len(),
        4,
        "1 attempt + 3 retries"
    );
    assert!(err.is(ErrorKind::ServerError), "{err}");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    assert_eq!(err.request().map(|r| r.attempts), Some(4));
    assert!(err.is_retryable());
    assert!(err.to_string().contains("after 4 attempts"), "{err}");
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    for status in [400u16, 401, 403, 404, 409, 501] {
        let server = MockServer::start(move |r, _| {
            (r.path() == SCALE_SETS).then(|| Reply::json(status, r#"{"message":"no"}"#))
        })
        .await;
        let client = pat_client(&server.org_url(), test_options(3));
        let err = client
            .get_runner_scale_set(1, "set")
            .await
            .expect_err("error status");
        assert_eq!(
            server.requests_to("/runnerscalesets").len(),
            1,
            "status {status}"
        );
        assert_eq!(err.status().map(|s| s.as_u16()), Some(status));
        assert!(!err.is_retryable(), "status {status}: {err}");
    }
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let server = MockServer::start(|r, earlier| {
        (r.path() == SCALE_SETS).then(|| {
            if earlier == 0 {
                Reply::json(429, "{}").with_header("retry-after", "1")
            } else {
                empty_list()
            }
        })
    })
    .await;
    let client = pat_client(&server.org_url(), test_options(3));
    client.admin_connection().await.expect("token");
    let started = Instant::now();
    let found = client
        .get_runner_scale_set(1, "set")
        .await
        .expect("second attempt succeeds");
    assert_eq!(found, None);
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "waited {:?}",
        started.elapsed()
    );
    assert_eq!(server.requests_to("/runnerscalesets").len(), 2);
}

#[tokio::test]
async fn retry_after_beyond_the_deadline_gives_up_at_once_with_the_real_error() {
    let server = MockServer::start(|r, _| {
        (r.path() == SCALE_SETS).then(|| Reply::json(429, "{}").with_header("retry-after", "3600"))
    })
    .await;
    let client = pat_client(&server.org_url(), test_options(3));
    let started = Instant::now();
    let err = client
        .get_runner_scale_set(1, "set")
        .await
        .expect_err("rate limited");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(err.is(ErrorKind::RateLimited), "{err}");
    assert_eq!(server.requests_to("/runnerscalesets").len(), 1);
}

#[tokio::test]
async fn runner_registration_retries_auth_failures_then_succeeds() {
    let server = MockServer::start(|r, earlier| {
        (r.path() == "/api/v3/actions/runner-registration" && earlier < 4)
            .then(|| Reply::json(401, r#"{"message":"not yet"}"#))
    })
    .await;
    let client = pat_client(&server.org_url(), test_options(4));
    client
        .admin_connection()
        .await
        .expect("fifth attempt succeeds");
    assert_eq!(server.requests_to("/actions/runner-registration").len(), 5);
}

#[tokio::test]
async fn runner_registration_surfaces_the_last_response() {
    let server = MockServer::start(|r, _| {
        (r.path() == "/api/v3/actions/runner-registration").then(|| {
            Reply::json(
                403,
                r#"{"message":"Resource not accessible","documentation_url":"https://docs"}"#,
            )
            .with_header("x-github-request-id", "ABCD:1234")
        })
    })
    .await;
    let client = pat_client(&server.org_url(), test_options(2));
    let err = client
        .get_runner_scale_set(1, "x")
        .await
        .expect_err("forbidden");
    assert_eq!(server.requests_to("/actions/runner-registration").len(), 3);
    assert!(err.is(ErrorKind::Forbidden), "{err}");
    assert_eq!(err.github_request_id(), Some("ABCD:1234"));
    assert!(err.to_string().contains("Resource not accessible"), "{err}");
    assert_eq!(
        server.requests_to("/runnerscalesets").len(),
        0,
        "no Actions call without a token"
    );
}

#[tokio::test]
async fn github_errors_carry_the_request_id_and_are_not_retried() {
    let server = MockServer::start(|r, _| {
        r.path().ends_with("/registration-token").then(|| {
            Reply::json(401, r#"{"message":"Bad credentials"}"#)
                .with_header("x-github-request-id", "REQ-1")
        })
    })
    .await;
    let client = pat_client(&server.org_url(), test_options(3));
    let err = client
        .admin_connection()
        .await
        .expect_err("bad credentials");
    assert!(err.is(ErrorKind::Unauthorized));
    assert_eq!(err.github_request_id(), Some("REQ-1"));
    assert_eq!(
        err.exception().map(|e| e.message.as_str()),
        Some("Bad credentials")
    );
    assert_eq!(server.requests_to("/registration-token").len(), 1);
    assert!(!err.to_string().contains("ghp_test"), "{err}");
}

fn short_timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(1),
        request: Duration::from_millis(300),
        call: Duration::from_secs(1),
        long_poll_request: Duration::from_secs(3),
        long_poll_call: Duration::from_secs(5),
    }
}

#[tokio::test]
async fn every_call_has_a_deadline() {
    let server = MockServer::start(|r, _| {
        (r.path() == SCALE_SETS).then(|| empty_list().after(Duration::from_secs(5)))
    })
    .await;
    let mut options = test_options(10);
    options.http.timeouts = short_timeouts();
    let client = pat_client(&server.org_url(), options);
    client.admin_connection().await.expect("token");
    let started = Instant::now();
    let err = client
        .get_runner_scale_set(1, "slow")
        .await
        .expect_err("too slow");
    let elapsed = started.elapsed();
    // The deadline is 1 s; the margin absorbs a loaded CI machine, while 5 s of latency per attempt plus
    // retries would take far longer without it.
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
    assert!(
        err.is(ErrorKind::Timeout) || err.is(ErrorKind::DeadlineExceeded),
        "{err}"
    );
    assert!(err.is_retryable());
    assert!(
        server.requests_to("/runnerscalesets").len() >= 2,
        "timeouts of safe calls are retried"
    );
}

#[tokio::test]
async fn the_long_poll_has_its_own_longer_deadline() {
    let server = MockServer::start(|r, _| {
        (r.path() == "/queue").then(|| Reply::empty(202).after(Duration::from_millis(800)))
    })
    .await;
    let mut options = test_options(0);
    options.http.timeouts = short_timeouts();
    let client = pat_client(&server.org_url(), options);
    let queue = format!("{}/queue", server.base_url());
    let message = client
        .get_message(&queue, &token(), 0, 5)
        .await
        .expect("202 after 800 ms");
    assert_eq!(message, None);
}

#[tokio::test]
async fn a_create_whose_response_timed_out_is_not_repeated() {
    let server = MockServer::start(|r, _| {
        (r.path() == SCALE_SETS && r.method == "POST")
            .then(|| Reply::json(200, "{}").after(Duration::from_secs(2)))
    })
    .await;
    let mut options = test_options(3);
    options.http.timeouts = short_timeouts();
    let client = pat_client(&server.org_url(), options);
    let err = client
        .create_runner_scale_set(&RunnerScaleSet {
            name: "set".into(),
            runner_group_id: 1,
            ..Default::default()
        })
        .await
        .expect_err("timed out");
    assert!(err.is(ErrorKind::Timeout), "{err}");
    assert_eq!(
        server.requests_to("/runnerscalesets").len(),
        1,
        "a create that may have happened is not repeated"
    );
}

#[tokio::test]
async fn refused_connections_are_retried_and_reported() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let client = pat_client(&format!("http://127.0.0.1:{port}/my-org"), test_options(2));
    let err = client
        .admin_connection()
        .await
        .expect_err("nothing listens");
    assert!(err.is(ErrorKind::Connect), "{err}");
    assert_eq!(err.request().map(|r| r.attempts), Some(3));
    assert!(err.is_retryable());
}

fn header<'a>(request: &'a Recorded, name: &str) -> &'a str {
    request
        .header(name)
        .unwrap_or_else(|| panic!("{name} missing on {}", request.uri))
}

#[tokio::test]
async fn request_shapes_follow_the_protocol() {
    let server = MockServer::start(|r, _| match (r.method.as_str(), r.path()) {
        ("GET", SCALE_SETS) => Some(empty_list()),
        ("GET", "/queue") => Some(Reply::empty(202)),
        ("DELETE", "/queue/17") => Some(Reply::empty(204)),
        ("POST", "/tenant/1/_apis/runtime/runnerscalesets/5/acquirejobs") => {
            Some(Reply::json(200, r#"{"count":1,"value":[1]}"#))
        }
        _ => None,
    })
    .await;
    let client = pat_client(&server.org_url(), test_options(0));
    client.set_scale_set_id(5);
    client
        .get_runner_scale_set(1, "a b&c")
        .await
        .expect("lookup");
    let queue = format!("{}/queue", server.base_url());
    client
        .get_message(&queue, &token(), 0, 10)
        .await
        .expect("poll");
    client
        .get_message(&queue, &token(), 16, 0)
        .await
        .expect("poll");
    client
        .delete_message(&queue, &token(), 17)
        .await
        .expect("ack");
    assert_eq!(
        client
            .acquire_jobs(5, &token(), &[1, 2])
            .await
            .expect("acquire"),
        [1]
    );

    let requests = server.requests();
    let registration = &requests[0];
    assert_eq!(
        registration.path(),
        "/api/v3/orgs/my-org/actions/runners/registration-token"
    );
    assert_eq!(registration.method, "POST");
    assert_eq!(header(registration, "authorization"), "Bearer ghp_test");
    assert_eq!(
        header(registration, "content-type"),
        "application/vnd.github.v3+json"
    );
    assert_eq!(header(registration, "content-length"), "0");

    let admin = &requests[1];
    assert_eq!(admin.path(), "/api/v3/actions/runner-registration");
    assert_eq!(
        header(admin, "authorization"),
        "RemoteAuth registration-token"
    );
    assert_eq!(header(admin, "content-type"), "application/json");
    assert_eq!(
        admin.body_text(),
        format!(
            "{{\"url\":\"{}\",\"runner_event\":\"register\"}}\n",
            server.org_url()
        )
    );

    let lookup = &requests[2];
    assert_eq!(
        lookup.uri.to_string(),
        "/tenant/1/_apis/runtime/runnerscalesets?api-version=6.0-preview&name=a+b%26c&runnerGroupId=1"
    );
    assert!(header(lookup, "authorization").starts_with("Bearer ey"));
    assert_eq!(header(lookup, "content-type"), "application/json");
    let ua: serde_json::Value =
        serde_json::from_str(header(lookup, "user-agent")).expect("UA is JSON");
    assert_eq!(ua["scale_set_id"], 5);
    assert_eq!(ua["kind"], "scaleset");

    let poll = &requests[3];
    assert_eq!(poll.uri.to_string(), "/queue");
    assert_eq!(
        header(poll, "accept"),
        "application/json; api-version=6.0-preview"
    );
    assert_eq!(header(poll, "authorization"), "Bearer mq-token");
    assert_eq!(header(poll, "x-scalesetmaxcapacity"), "10");
    assert!(poll.header("content-type").is_none());
    assert_eq!(requests[4].uri.to_string(), "/queue?lastMessageId=16");
    assert_eq!(header(&requests[4], "x-scalesetmaxcapacity"), "0");

    let ack = &requests[5];
    assert_eq!((ack.method.as_str(), ack.path()), ("DELETE", "/queue/17"));
    assert_eq!(header(ack, "authorization"), "Bearer mq-token");
    assert_eq!(header(ack, "content-type"), "application/json");
    assert!(ack.header("x-scalesetmaxcapacity").is_none());

    let acquire = &requests[6];
    assert_eq!(acquire.uri.query(), Some("api-version=6.0-preview"));
    assert_eq!(header(acquire, "authorization"), "Bearer mq-token");
    assert_eq!(acquire.body_text(), "[1,2]");
}

#[tokio::test]
async fn admin_token_is_refreshed_only_near_expiry() {
    let server = MockServer::start(|r, _| (r.path() == SCALE_SETS).then(empty_list)).await;
    server.set_admin_token(admin_jwt(3600));
    let client = pat_client(&server.org_url(), test_options(0));
    for _ in 0..3 {
        client.get_runner_scale_set(1, "a").await.expect("lookup");
    }
    assert_eq!(
        server.requests_to("/actions/runner-registration").len(),
        1,
        "an hour-long token is reused"
    );

    let server = MockServer::start(|r, _| (r.path() == SCALE_SETS).then(empty_list)).await;
    server.set_admin_token(admin_jwt(59));
    let client = pat_client(&server.org_url(), test_options(0));
    for _ in 0..3 {
        client.get_runner_scale_set(1, "a").await.expect("lookup");
    }
    assert_eq!(
        server.requests_to("/actions/runner-registration").len(),
        3,
        "a token within a minute of expiry is refreshed before each call"
    );
    assert_eq!(client.admin_token_refreshes(), 3);
}

#[tokio::test]
async fn fifty_concurrent_callers_share_one_refresh() {
    let server = MockServer::start(|r, _| match r.path() {
        SCALE_SETS => Some(empty_list()),
        "/api/v3/actions/runner-registration" => None.or_else(|| {
            // Slow enough that every caller arrives while the refresh is in flight.
            let token = admin_jwt(3600);
            Some(
                Reply::json(
                    201,
                    format!(
                        r#"{{"url":"http://{}/tenant/1/","token":"{token}"}}"#,
                        r.header("host").unwrap_or_default()
                    ),
                )
                .after(Duration::from_millis(300)),
            )
        }),
        _ => None,
    })
    .await;
    let client = pat_client(&server.org_url(), test_options(0));
    let calls = (0..50).map(|i| {
        let client = client.clone();
        tokio::spawn(async move { client.get_runner_scale_set(1, &format!("set-{i}")).await })
    });
    for call in calls {
        call.await.expect("task").expect("lookup");
    }
    assert_eq!(server.requests_to("/actions/runner-registration").len(), 1);
    assert_eq!(server.requests_to("/registration-token").len(), 1);
    assert_eq!(client.admin_token_refreshes(), 1);
    assert_eq!(server.requests_to("/runnerscalesets").len(), 50);
}

#[tokio::test]
async fn a_failed_refresh_is_shared_with_callers_waiting_for_it() {
    let server = MockServer::start(|r, _| {
        (r.path() == "/api/v3/actions/runner-registration")
            // Long enough that all ten callers are waiting before it fails, even on a loaded machine.
            .then(|| Reply::json(400, r#"{"message":"broken"}"#).after(Duration::from_secs(1)))
    })
    .await;
    let client = pat_client(&server.org_url(), test_options(0));
    let calls: Vec<_> = (0..10)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.get_runner_scale_set(1, "a").await })
        })
        .collect();
    for call in calls {
        let err = call.await.expect("task").expect_err("refresh fails");
        assert_eq!(err.status().map(|s| s.as_u16()), Some(400), "{err}");
    }
    assert_eq!(server.requests_to("/actions/runner-registration").len(), 1);
    client
        .get_runner_scale_set(1, "a")
        .await
        .expect_err("still failing");
    assert_eq!(
        server.requests_to("/actions/runner-registration").len(),
        2,
        "a later call tries again"
    );
}

#[tokio::test]
async fn service_errors_are_classified_with_their_diagnostics() {
    let server = MockServer::start(|r, _| {
        r.path().ends_with("/generatejitconfig").then(|| {
            Reply::json(
                409,
                r#"{"typeName":"GitHub.DistributedTask.WebApi.AgentExistsException, GitHub.DistributedTask.WebApi","message":"Runner 'r-1' already exists."}"#,
            )
            .with_header("activityid", "act-42")
        })
    })
    .await;
    let client = pat_client(&server.org_url(), test_options(3));
    let err = client
        .generate_jit_runner_config(
            3,
            &JitSetting {
                name: "r-1".into(),
                work_folder: String::new(),
            },
        )
        .await
        .expect_err("exists");
    assert!(err.is(ErrorKind::RunnerExists), "{err}");
    assert_eq!(err.activity_id(), Some("act-42"));
    assert_eq!(
        err.exception().map(|e| e.message.as_str()),
        Some("Runner 'r-1' already exists.")
    );
    assert_eq!(server.requests_to("/generatejitconfig").len(), 1);
}

#[tokio::test]
async fn bodies_with_a_bom_and_odd_key_casing_decode() {
    let server = MockServer::start(|r, _| {
        (r.path() == SCALE_SETS).then(|| {
            Reply::json(
                200,
                "\u{feff}{\"Count\":1,\"VALUE\":[{\"ID\":42,\"Name\":\"set\",\"runnerSetting\":{\"disableUpdate\":true},\"createdOn\":null}]}",
            )
        })
    })
    .await;
    let client = pat_client(&server.org_url(), test_options(0));
    let set = client
        .get_runner_scale_set(1, "set")
        .await
        .expect("decodes")
        .expect("found");
    assert_eq!(
        (set.id, set.name.as_str(), set.runner_setting.disable_update),
        (42, "set", true)
    );
}

#[tokio::test]
async fn ambiguous_and_missing_lookups() {
    let server = MockServer::start(|r, _| match r.path() {
        SCALE_SETS => Some(Reply::json(
            200,
            r#"{"count":2,"value":[{"id":1},{"id":2}]}"#,
        )),
        "/tenant/1/_apis/runtime/runnergroups/" => {
            Some(Reply::json(200, r#"{"count":0,"value":[]}"#))
        }
        "/tenant/1/_apis/distributedtask/pools/0/agents" => {
            Some(Reply::json(200, r#"{"count":0,"value":[{"id":9}]}"#))
        }
        _ => None,
    })
    .await;
    let client = pat_client(&server.org_url(), test_options(0));
    let err = client
        .get_runner_scale_set(1, "dup")
        .await
        .expect_err("two sets");
    assert!(err.is(ErrorKind::AmbiguousName), "{err}");
    let err = client
        .get_runner_group_by_name("gpu")
        .await
        .expect_err("no group");
    assert!(err.is(ErrorKind::RunnerGroupNotFound), "{err}");
    assert_eq!(
        client.get_runner_by_name("r").await.expect("count decides"),
        None,
        "count 0 means none even when value is not empty"
    );
}

#[tokio::test]
async fn custom_root_ca_is_trusted_and_unknown_certificates_fail_without_retry() {
    let pki = TestPki::new(&["127.0.0.1"]);
    let (port, seen) = start_tls_server(&pki).await;
    let queue = format!("https://127.0.0.1:{port}/queue");
    let config = "https://127.0.0.1/my-org";

    for roots in [
        TlsRoots::SystemAnd(pki.ca_pem.clone()),
        TlsRoots::Only(pki.ca_pem.clone()),
    ] {
        let mut options = test_options(3);
        options.http.tls_roots = roots;
        let client = pat_client(config, options);
        assert_eq!(
            client
                .get_message(&queue, &token(), 0, 1)
                .await
                .expect("trusted"),
            None
        );
    }
    assert_eq!(seen.lock().expect("lock").len(), 2);

    let client = pat_client(config, test_options(3));
    let err = client
        .get_message(&queue, &token(), 0, 1)
        .await
        .expect_err("untrusted");
    assert!(err.is(ErrorKind::TlsCertificate), "{err:?}");
    assert_eq!(
        err.request().map(|r| r.attempts),
        Some(1),
        "certificate failures are not retried"
    );
    assert!(!err.is_retryable());

    let mut options = test_options(0);
    options.http.danger_accept_invalid_certs = true;
    let client = pat_client(config, options);
    assert_eq!(
        client
            .get_message(&queue, &token(), 0, 1)
            .await
            .expect("verification off"),
        None
    );
}

fn proxy_settings(addr: std::net::SocketAddr) -> ProxyConfig {
    let server = ProxyServer::new(format!("http://{addr}"))
        .with_credentials("user", SecretString::new("p@ss word"));
    ProxyConfig::Explicit(ProxySettings {
        http: Some(server.clone()),
        https: Some(server),
        no_proxy: Vec::new(),
    })
}

fn expected_proxy_auth() -> String {
    format!(
        "proxy-authorization: Basic {}",
        base64::engine::general_purpose::STANDARD.encode("user:p@ss word")
    )
}

#[tokio::test]
async fn http_requests_go_through_the_proxy_with_credentials() {
    let (proxy, seen) = start_proxy(None).await;
    let mut options = test_options(0);
    options.http.proxy = proxy_settings(proxy);
    let client = pat_client("http://github.invalid/my-org", options);
    let message = client
        .get_message("http://queue.invalid/q", &token(), 3, 1)
        .await
        .expect("answered by the proxy");
    assert_eq!(message, None);
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    let head = seen[0].to_ascii_lowercase();
    assert!(
        head.starts_with("get http://queue.invalid/q?lastmessageid=3 http/1.1"),
        "{head}"
    );
    assert!(
        head.contains(&expected_proxy_auth().to_ascii_lowercase()),
        "{head}"
    );
}

#[tokio::test]
async fn https_requests_tunnel_through_the_proxy() {
    let pki = TestPki::new(&["queue.invalid"]);
    let (tls_port, tls_seen) = start_tls_server(&pki).await;
    let (proxy, seen) = start_proxy(Some(([127, 0, 0, 1], tls_port).into())).await;
    let mut options = test_options(0);
    options.http.proxy = proxy_settings(proxy);
    options.http.tls_roots = TlsRoots::SystemAnd(pki.ca_pem.clone());
    let client = pat_client("https://github.invalid/my-org", options);
    let message = client
        .get_message("https://queue.invalid/q", &token(), 0, 1)
        .await
        .expect("tunnelled to the TLS server");
    assert_eq!(message, None);
    let seen = seen.lock().expect("lock").clone();
    let head = seen[0].to_ascii_lowercase();
    assert!(
        head.starts_with("connect queue.invalid:443 http/1.1"),
        "{head}"
    );
    assert!(
        head.contains(&expected_proxy_auth().to_ascii_lowercase()),
        "{head}"
    );
    assert_eq!(tls_seen.lock().expect("lock").len(), 1);
}

#[tokio::test]
async fn loopback_and_no_proxy_hosts_are_reached_directly() {
    let (proxy, seen) = start_proxy(None).await;
    let server = MockServer::start(|r, _| (r.path() == "/queue").then(|| Reply::empty(202))).await;
    let mut options = test_options(0);
    options.http.proxy = proxy_settings(proxy);
    let client = pat_client(&server.org_url(), options);
    let queue = format!("{}/queue", server.base_url());
    client
        .get_message(&queue, &token(), 0, 1)
        .await
        .expect("direct");
    let localhost_queue = queue.replace("127.0.0.1", "localhost");
    client
        .get_message(&localhost_queue, &token(), 0, 1)
        .await
        .expect("direct");
    assert!(
        seen.lock().expect("lock").is_empty(),
        "loopback is never proxied"
    );
    assert_eq!(server.requests_to("/queue").len(), 2);
}

#[tokio::test]
async fn message_session_refreshes_once_on_401() {
    let session_json = |token: &str, base: &str| {
        format!(
            r#"{{"sessionId":"3f2b7c9e-5a41-4d0e-9a8b-2c6f1e0d7a55","ownerName":"me","messageQueueUrl":"{base}/queue","messageQueueAccessToken":"{token}","statistics":{{"totalAssignedJobs":3}}}}"#
        )
    };
    let base = Arc::new(std::sync::OnceLock::<String>::new());
    let base_for_handler = Arc::clone(&base);
    let server = MockServer::start(move |r, earlier| {
        let base = base_for_handler.get().cloned().unwrap_or_default();
        match (r.method.as_str(), r.path()) {
            ("POST", "/tenant/1/_apis/runtime/runnerscalesets/7/sessions") => {
                Some(Reply::json(200, session_json("old", &base)))
            }
            ("PATCH", p) if p.starts_with("/tenant/1/_apis/runtime/runnerscalesets/7/sessions/") => {
                Some(Reply::json(200, session_json(&format!("new-{earlier}"), &base)))
            }
            ("GET", "/queue") if r.header("authorization") == Some("Bearer new-0") => Some(Reply::json(
                200,
                r#"{"messageId":1,"messageType":"RunnerScaleSetJobMessages","statistics":{"totalAssignedJobs":4}}"#,
            )),
            ("GET", "/queue") | ("DELETE", "/queue/1") => Some(Reply::json(401, "expired")),
            _ => None,
        }
    })
    .await;
    base.set(server.base_url().to_owned()).expect("set once");
    let client = pat_client(&server.org_url(), test_options(0));
    let session = client.message_session(7, "me").await.expect("session");
    assert_eq!(
        session.statistics().await.map(|s| s.total_assigned_jobs),
        Some(3)
    );

    let message = session
        .get_message(0, 2)
        .await
        .expect("refresh then retry")
        .expect("a message");
    assert_eq!(message.message_id, 1);
    assert_eq!(
        server
            .requests_to("/sessions/3f2b7c9e-5a41-4d0e-9a8b-2c6f1e0d7a55")
            .len(),
        1
    );

    // The ack keeps failing with 401: exactly one more refresh, then the error.
    let err = session.delete_message(1).await.expect_err("still 401");
    assert!(err.is(ErrorKind::MessageQueueTokenExpired), "{err}");
    assert_eq!(
        server
            .requests_to("/sessions/3f2b7c9e-5a41-4d0e-9a8b-2c6f1e0d7a55")
            .len(),
        2
    );
    assert_eq!(
        server.requests_to("/queue/1").len(),
        2,
        "one try, one retry"
    );
}

#[tokio::test]
async fn debug_output_of_a_client_reveals_no_secret() {
    let server = MockServer::start(|r, _| (r.path() == SCALE_SETS).then(empty_list)).await;
    let mut options = test_options(0);
    options.http.proxy = ProxyConfig::Explicit(ProxySettings {
        http: Some(ProxyServer::new("http://u:url-secret@proxy.invalid:3128")),
        https: Some(
            ProxyServer::new("http://proxy.invalid:3128")
                .with_credentials("u", SecretString::new("pw-secret")),
        ),
        no_proxy: Vec::new(),
    });
    let client = pat_client(&server.org_url(), options);
    client
        .get_runner_scale_set(1, "x")
        .await
        .expect("loopback goes direct");
    let printed = format!("{client:?}");
    for secret in [
        "url-secret",
        "pw-secret",
        "ghp_test",
        "registration-token",
        "eyJ",
    ] {
        assert!(!printed.contains(secret), "{secret} leaked: {printed}");
    }
}
