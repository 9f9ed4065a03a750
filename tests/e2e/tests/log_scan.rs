//! The end-to-end world at debug level, scanned: the manager binary and the real listener run jobs through
//! simulated runners with `--log-level=debug`, and no line of their logs carries the PAT, a runner's JIT config,
//! a private key or anything shaped like an issued token (a GitHub installation token or a JWT).

use std::collections::BTreeSet;
use std::time::Duration;

use e2e::world::{GITHUB_TOKEN, World, WorldConfig};
use kube::ResourceExt;

const WAIT: Duration = Duration::from_secs(300);

/// Whether `line` holds something shaped like a JWT: three base64url segments starting with `eyJ`.
fn has_jwt(line: &str) -> bool {
    line.match_indices("eyJ").any(|(at, _)| {
        let token: String = line[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .collect();
        token.split('.').filter(|part| part.len() >= 8).count() >= 3
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn debug_logs_of_a_whole_run_hold_no_secret() {
    e2e::init_test_tracing();
    let world = World::start(
        "e2e-logscan",
        WorldConfig {
            release: "logscan".to_owned(),
            manager_process: true,
            manager_args: vec!["--log-level=debug".to_owned()],
            ..WorldConfig::default()
        },
    )
    .await
    .expect("the world starts");
    world
        .wait_listening(WAIT)
        .await
        .expect("a listener session");
    let ids = world.enqueue(10).expect("enqueue");
    // The JIT configs exist only while their runners do: collect them as the jobs run.
    let mut jit_configs: BTreeSet<String> = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        for secret in world.jit_secrets().await.expect("list Secrets") {
            if let Some(token) = secret.data.as_ref().and_then(|d| d.get("jitToken")) {
                jit_configs.insert(String::from_utf8_lossy(&token.0).into_owned());
            }
        }
        let snapshot = world.fake.state().snapshot();
        if e2e::world::completed(&snapshot, &ids) == ids.len() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "jobs did not complete: {}",
            world.diagnostics().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!jit_configs.is_empty(), "no JIT config was seen");

    let mut logs = vec![(
        "manager".to_owned(),
        world
            .manager_log(64 << 20)
            .expect("the manager runs as a process"),
    )];
    for pod in world.listener_pods().await.expect("listener pods") {
        let name = pod.name_any();
        if let Some(log) = world.listener_log(&name) {
            logs.push((format!("listener {name}"), log));
        }
    }
    let manager_log = &logs[0].1;
    assert!(
        manager_log.contains("DEBUG") && manager_log.contains("scaled up"),
        "the manager's log is not a debug log of this run:\n{}",
        &manager_log[..manager_log.len().min(2000)]
    );
    assert!(
        logs.iter()
            .any(|(who, log)| who.starts_with("listener") && log.contains("job started")),
        "no listener log of this run"
    );
    let mut leaks = Vec::new();
    for (who, log) in &logs {
        for line in log.lines() {
            let leaked = [
                (line.contains(GITHUB_TOKEN), "the PAT"),
                (
                    jit_configs.iter().any(|jit| line.contains(jit.as_str())),
                    "a JIT config",
                ),
                (line.contains("PRIVATE KEY"), "a private key"),
                (line.contains("ghs_"), "an installation token"),
                (has_jwt(line), "a JWT"),
            ];
            for (hit, what) in leaked {
                if hit {
                    leaks.push(format!(
                        "{who}: {what} in: {}",
                        &line[..line.len().min(300)]
                    ));
                }
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "secrets in the logs:\n{}",
        leaks.join("\n")
    );
    world.shutdown().await.expect("shutdown");
}

#[test]
fn jwt_shapes_are_recognised() {
    assert!(has_jwt(
        "token=eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiIxMjMifQ.c2lnbmF0dXJlLXZhbHVl rest"
    ));
    assert!(!has_jwt("eyJ is just a prefix here"));
    assert!(!has_jwt("no token at all"));
}
