//! The standalone binary prints its base URL first, serves, and exits cleanly on SIGTERM.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

#[tokio::test]
async fn binary_prints_its_url_serves_and_stops_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fake-actions-service"))
        .args(["--addr", "127.0.0.1:0", "--long-poll-timeout-ms", "200"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the binary starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let first_line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    let base = first_line.trim();
    assert!(base.starts_with("http://127.0.0.1:"), "{first_line:?}");

    let response = reqwest::get(format!("{base}/_fake/healthz")).await.unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let response = reqwest::Client::new()
        .post(format!(
            "{base}/api/v3/orgs/o/actions/runners/registration-token"
        ))
        .header("Authorization", "Bearer pat")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::CREATED);

    // SIGTERM through kill(1): the workspace forbids unsafe code, so no libc call.
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::task::spawn_blocking(move || child.wait()),
    )
    .await
    .expect("the binary exits after SIGTERM")
    .unwrap()
    .unwrap();
    assert!(exit.success(), "{exit:?}");
}
