//! The GitHub REST endpoints for a workflow run's jobs and for re-running one job, over real HTTP: what a manager
//! does to re-run a job its runner's pod lost (list the run's jobs, find the one that ran on the runner, re-run it).

mod common;

use std::time::Duration;

use common::{
    Session, Tenant, connect, control, fast_config, job_messages, json_body, kinds, start,
};
use fake_actions_service::{
    Config, ErrorFault, Faults, JobDelivery, JobState, JobView, StateSnapshot,
};
use pretty_assertions::assert_eq;
use reqwest::header::LINK;
use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};

const TOKEN: &str = "ghp_test";

/// A GitHub REST call under the fake's GHES-form API base, with `token` when given.
async fn github(
    base: &str,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Response {
    let request = reqwest::Client::new()
        .request(method, format!("{base}/api/v3/{path}"))
        .header("Accept", "application/vnd.github+json")
        .header("X-GitHub-Api-Version", "2022-11-28");
    let request = match token {
        Some(token) => request.header("Authorization", format!("Bearer {token}")),
        None => request,
    };
    let request = match body {
        Some(body) => request.json(&body),
        None => request,
    };
    request.send().await.unwrap()
}

async fn list_jobs(base: &str, run: i64, query: &str) -> Value {
    let response = github(
        base,
        Method::GET,
        &format!("repos/octo/app/actions/runs/{run}/jobs{query}"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    json_body(response).await
}

async fn rerun(base: &str, job: i64, body: Option<Value>) -> Response {
    github(
        base,
        Method::POST,
        &format!("repos/octo/app/actions/jobs/{job}/rerun"),
        Some(TOKEN),
        body,
    )
    .await
}

async fn job_view(base: &str, request_id: i64) -> JobView {
    let response = control(base, Method::GET, &format!("jobs/{request_id}"), None).await;
    assert_eq!(response.status(), StatusCode::OK);
    serde_json::from_value(json_body(response).await).unwrap()
}

async fn enqueue(base: &str, body: Value) -> Vec<i64> {
    let response = control(base, Method::POST, "jobs", Some(body)).await;
    assert_eq!(response.status(), StatusCode::OK);
    serde_json::from_value(json_body(response).await["jobIds"].clone()).unwrap()
}

async fn control_ok(base: &str, path: &str, body: Option<Value>) {
    let response = control(base, Method::POST, path, body).await;
    assert_eq!(response.status(), StatusCode::OK, "{path}");
}

/// The next message after `last`, acknowledged; returns its id and job messages.
async fn next_acked(session: &Session, last: i64) -> (i64, Vec<Value>) {
    let message = session.next_message(last).await;
    let id = message["messageId"].as_i64().unwrap();
    assert_eq!(
        session.delete_message(id).await.status(),
        StatusCode::NO_CONTENT
    );
    (id, job_messages(&message))
}

/// A runner of `set` with its JIT config, reported online as a runner pod does.
async fn online_runner(tenant: &Tenant, base: &str, set: i64, name: &str) -> i64 {
    let jit = json_body(tenant.jit_config(set, name).await).await;
    control_ok(
        base,
        "runners/online",
        Some(json!({"jitConfig": jit["encodedJITConfig"]})),
    )
    .await;
    jit["runner"]["id"].as_i64().unwrap()
}

fn github_error(body: &Value, message: &str) {
    assert_eq!(body["message"], message);
    assert!(body["documentation_url"].is_string(), "{body}");
}

fn page_of(link: &str, rel: &str) -> Option<String> {
    link.split(", ").find_map(|part| {
        let (url, kind) = part.split_once("; ")?;
        (kind == format!("rel=\"{rel}\""))
            .then(|| url.trim_start_matches('<').trim_end_matches('>').to_owned())
    })
}

/// A tenant `octo/app` with scale set `arc-set` and a message session on it.
async fn scale_set_with_session(base: &str) -> (Tenant, i64, Session) {
    let tenant = connect(base, "octo/app").await;
    let set = tenant.create_scale_set("arc-set").await["id"]
        .as_i64()
        .unwrap();
    let session = tenant.session(set).await;
    (tenant, set, session)
}

#[tokio::test]
async fn run_jobs_are_listed_by_page_with_links_and_github_errors() {
    let fake = start(fast_config()).await;
    let base = fake.base_url();
    let tenant = connect(&base, "octo/app").await;
    tenant.create_scale_set("arc-set").await;
    let ids = enqueue(
        &base,
        json!({"scaleSetName": "arc-set", "count": 3, "displayName": "build", "labels": ["arc-set", "linux"]}),
    )
    .await;
    let first = job_view(&base, ids[0]).await;
    let run = first.workflow_run_id;
    assert_eq!((first.run_attempt, first.rerun_of), (1, None));

    // Page 1 of 2: two jobs, links to the next and last pages.
    let response = github(
        &base,
        Method::GET,
        &format!("repos/octo/app/actions/runs/{run}/jobs?per_page=2"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().contains_key("x-github-request-id"));
    let link = response.headers()[LINK].to_str().unwrap().to_owned();
    let page = json_body(response).await;
    assert_eq!(page["total_count"], 3);
    let jobs = page["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    let job = &jobs[0];
    assert_eq!(job["id"], first.rest_id);
    assert_ne!(job["id"], ids[0], "the REST id is not the request id");
    assert_eq!(job["run_id"], run);
    assert_eq!(job["run_attempt"], 1);
    assert_eq!(job["name"], "build-1");
    assert_eq!(job["status"], "queued");
    assert_eq!(job["conclusion"], Value::Null);
    assert_eq!(job["runner_id"], Value::Null);
    assert_eq!(job["runner_name"], Value::Null);
    assert_eq!(job["completed_at"], Value::Null);
    assert_eq!(job["labels"], json!(["arc-set", "linux"]));
    assert_eq!(job["head_branch"], "main");
    assert_eq!(job["workflow_name"], ".github/workflows/ci.yml");
    assert_eq!(job["head_sha"].as_str().unwrap().len(), 40);
    assert_eq!(job["steps"], json!([]));
    for key in [
        "run_url",
        "node_id",
        "url",
        "html_url",
        "check_run_url",
        "created_at",
        "started_at",
    ] {
        assert!(job[key].is_string(), "{key} in {job}");
    }
    assert_eq!(jobs[1]["name"], "build-2");
    let next = page_of(&link, "next").expect("a next link");
    assert!(
        next.contains("page=2") && next.contains("per_page=2"),
        "{next}"
    );
    assert_eq!(page_of(&link, "last"), Some(next.clone()));

    // Following the link: the last page, pointing back.
    let response = reqwest::Client::new()
        .get(&next)
        .header("Authorization", format!("token {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let link = response.headers()[LINK].to_str().unwrap().to_owned();
    assert!(page_of(&link, "next").is_none());
    assert!(page_of(&link, "prev").unwrap().contains("page=1"));
    assert!(page_of(&link, "first").unwrap().contains("page=1"));
    let page = json_body(response).await;
    assert_eq!(page["total_count"], 3);
    assert_eq!(page["jobs"].as_array().unwrap().len(), 1);
    assert_eq!(page["jobs"][0]["name"], "build-3");

    // One page only: no Link header; filter=all is the same before any re-run.
    let response = github(
        &base,
        Method::GET,
        &format!("repos/octo/app/actions/runs/{run}/jobs?filter=all"),
        Some(TOKEN),
        None,
    )
    .await;
    assert!(!response.headers().contains_key(LINK));
    assert_eq!(json_body(response).await["total_count"], 3);

    // Unknown run, another repository (names are case-insensitive), no or bad credentials, a bad filter.
    for path in [
        format!("repos/octo/app/actions/runs/{}/jobs", run + 1),
        format!("repos/octo/other/actions/runs/{run}/jobs"),
        "repos/octo/app/actions/runs/not-a-number/jobs".to_owned(),
    ] {
        let response = github(&base, Method::GET, &path, Some(TOKEN), None).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
        github_error(&json_body(response).await, "Not Found");
    }
    let response = github(
        &base,
        Method::GET,
        &format!("repos/OCTO/App/actions/runs/{run}/jobs"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let response = github(
        &base,
        Method::GET,
        &format!("repos/octo/app/actions/runs/{run}/jobs"),
        None,
        None,
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    github_error(&json_body(response).await, "Requires authentication");
    let response = github(
        &base,
        Method::GET,
        &format!("repos/octo/app/actions/runs/{run}/jobs?filter=newest"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);

    // Every routed request is counted, refused ones included (a run id that is not a number routes nowhere).
    assert_eq!(fake.state().count("list_run_jobs"), 8);
    assert_eq!(fake.state().count("rerun_job"), 0);
}

#[tokio::test]
async fn a_failed_job_is_rerun_and_reaches_the_scale_set_as_a_new_job() {
    let fake = start(fast_config()).await;
    let base = fake.base_url();
    let (tenant, set, session) = scale_set_with_session(&base).await;
    let ids = enqueue(&base, json!({"scaleSetId": set, "displayName": "test"})).await;
    let job = ids[0];

    // The job runs on runner-1 and fails.
    let (last, available) = next_acked(&session, 0).await;
    assert_eq!(kinds(&available), vec!["JobAvailable"]);
    let run = available[0]["workflowRunId"].as_i64().unwrap();
    session.acquire(&tenant, &[job]).await;
    let (last, _) = next_acked(&session, last).await;
    online_runner(&tenant, &base, set, "runner-1").await;
    control_ok(&base, &format!("jobs/{job}/start"), None).await;
    control_ok(
        &base,
        &format!("jobs/{job}/finish"),
        Some(json!({"result": "failed"})),
    )
    .await;
    let (last, messages) = next_acked(&session, last).await;
    assert_eq!(kinds(&messages), vec!["JobStarted", "JobCompleted"]);

    // The manager's steps: list the run's jobs, find the one that ran on the runner, re-run it.
    let listed = list_jobs(&base, run, "").await;
    let failed = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|job| job["runner_name"] == "runner-1")
        .expect("the job that ran on runner-1")
        .clone();
    assert_eq!(failed["status"], "completed");
    assert_eq!(failed["conclusion"], "failure");
    assert!(failed["runner_id"].is_i64());
    assert!(failed["completed_at"].is_string());
    let failed_id = failed["id"].as_i64().unwrap();
    let response = rerun(
        &base,
        failed_id,
        Some(json!({"enable_debug_logging": true})),
    )
    .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(json_body(response).await, json!({}));

    // The listener hears of the new attempt as of any new job and acquires it.
    let (_, messages) = next_acked(&session, last).await;
    assert_eq!(kinds(&messages), vec!["JobAvailable"]);
    let again = messages[0]["runnerRequestId"].as_i64().unwrap();
    assert_ne!(again, job);
    assert_eq!(messages[0]["workflowRunId"], run);
    assert_eq!(messages[0]["jobDisplayName"], "test-1");
    assert_eq!(messages[0]["repositoryName"], "app");
    assert_eq!(messages[0]["ownerName"], "octo");
    let response = session.acquire(&tenant, &[again]).await;
    assert_eq!(
        json_body(response).await,
        json!({"count": 1, "value": [again]})
    );

    // latest shows the new attempt instead of the old one; all shows both.
    let latest = list_jobs(&base, run, "?filter=latest").await;
    assert_eq!(latest["total_count"], 1);
    let new = &latest["jobs"][0];
    assert_ne!(new["id"], failed_id);
    assert_eq!(
        (
            &new["run_attempt"],
            &new["name"],
            &new["status"],
            &new["runner_name"]
        ),
        (&json!(2), &json!("test-1"), &json!("queued"), &Value::Null)
    );
    let all = list_jobs(&base, run, "?filter=all").await;
    let attempts: Vec<(i64, i64)> = all["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| {
            (
                job["id"].as_i64().unwrap(),
                job["run_attempt"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        vec![(failed_id, 1), (new["id"].as_i64().unwrap(), 2)]
    );

    // The control API links the attempts.
    let old_view = job_view(&base, job).await;
    assert_eq!(old_view.next_attempt, Some(again));
    let new_view = job_view(&base, again).await;
    assert_eq!(
        (
            new_view.state,
            new_view.run_attempt,
            new_view.rerun_of,
            new_view.rest_id,
            new_view.debug_logging,
            new_view.scale_set_id,
        ),
        (
            JobState::Acquired,
            2,
            Some(job),
            new["id"].as_i64().unwrap(),
            true,
            Some(set)
        )
    );
    let snapshot: StateSnapshot =
        serde_json::from_value(json_body(control(&base, Method::GET, "state", None).await).await)
            .unwrap();
    assert_eq!(snapshot.job_reruns, 1);
    assert_eq!(fake.state().count("rerun_job"), 1);
    assert_eq!(fake.state().count("list_run_jobs"), 3);
}

#[tokio::test]
async fn rerun_refuses_unfinished_jobs_unknown_jobs_and_missing_credentials() {
    let fake = start(fast_config()).await;
    let base = fake.base_url();
    let (tenant, set, session) = scale_set_with_session(&base).await;
    let job = enqueue(&base, json!({"scaleSetId": set})).await[0];
    session.acquire(&tenant, &[job]).await;
    online_runner(&tenant, &base, set, "runner-1").await;
    control_ok(&base, &format!("jobs/{job}/start"), None).await;
    let view = job_view(&base, job).await;
    assert_eq!(view.state, JobState::Running);

    // Still running: GitHub refuses.
    let response = rerun(&base, view.rest_id, None).await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    github_error(
        &json_body(response).await,
        "The workflow run containing this job is already running",
    );
    // Unknown job, a request id for a REST id, another repository, no credentials, a body that is not JSON.
    for id in [view.rest_id + 1000, job] {
        let response = rerun(&base, id, None).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        github_error(&json_body(response).await, "Not Found");
    }
    let response = github(
        &base,
        Method::POST,
        &format!("repos/octo/other/actions/jobs/{}/rerun", view.rest_id),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let response = github(
        &base,
        Method::POST,
        &format!("repos/octo/app/actions/jobs/{}/rerun", view.rest_id),
        None,
        None,
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let response = reqwest::Client::new()
        .post(format!(
            "{base}/api/v3/repos/octo/app/actions/jobs/{}/rerun",
            view.rest_id
        ))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    // GET is not the re-run.
    let response = github(
        &base,
        Method::GET,
        &format!("repos/octo/app/actions/jobs/{}/rerun", view.rest_id),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);

    // Once it completed (cancelled here), it can be re-run, without a body.
    control_ok(&base, &format!("jobs/{job}/cancel"), None).await;
    assert_eq!(
        rerun(&base, view.rest_id, None).await.status(),
        StatusCode::CREATED
    );
    // The attempt that was re-run is not the one to re-run again.
    let new = job_view(&base, job).await.next_attempt.unwrap();
    control_ok(&base, &format!("jobs/{new}/cancel"), None).await;
    assert_eq!(
        rerun(&base, view.rest_id, None).await.status(),
        StatusCode::FORBIDDEN
    );
    let new_rest_id = job_view(&base, new).await.rest_id;
    assert_eq!(
        rerun(&base, new_rest_id, None).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(fake.state().snapshot().job_reruns, 2);
    // Refused calls are counted too; the GET routed nowhere.
    assert_eq!(fake.state().count("rerun_job"), 9);
}

#[tokio::test]
async fn both_endpoints_can_be_faulted_by_name() {
    let fake = start(fast_config()).await;
    let base = fake.base_url();
    let tenant = connect(&base, "octo/app").await;
    tenant.create_scale_set("arc-set").await;
    let job = enqueue(&base, json!({"scaleSetName": "arc-set"})).await[0];
    control_ok(&base, &format!("jobs/{job}/cancel"), None).await;
    let view = job_view(&base, job).await;
    fake.state()
        .set_faults(Faults {
            errors: vec![
                ErrorFault {
                    endpoint: Some("list_run_jobs".into()),
                    status: 500,
                    rate: 1.0,
                    count: Some(1),
                    retry_after_secs: None,
                },
                ErrorFault {
                    endpoint: Some("rerun_job".into()),
                    status: 429,
                    rate: 1.0,
                    count: Some(1),
                    retry_after_secs: Some(3),
                },
            ],
            ..Faults::default()
        })
        .unwrap();
    let path = format!("repos/octo/app/actions/runs/{}/jobs", view.workflow_run_id);
    let response = github(&base, Method::GET, &path, Some(TOKEN), None).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(json_body(response).await["documentation_url"].is_string());
    let response = github(&base, Method::GET, &path, Some(TOKEN), None).await;
    assert_eq!(response.status(), StatusCode::OK);

    let response = rerun(&base, view.rest_id, None).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "3");
    assert_eq!(
        job_view(&base, job).await.next_attempt,
        None,
        "a faulted re-run changes nothing"
    );
    assert_eq!(
        rerun(&base, view.rest_id, None).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        (
            fake.state().count("list_run_jobs"),
            fake.state().count("rerun_job")
        ),
        (2, 2)
    );
}

#[tokio::test]
async fn a_job_lost_with_its_runner_is_rerun_and_assigned_directly() {
    // github.com's delivery, and the case the re-run is for: the runner stops renewing its job (its pod was
    // killed), the service fails the job, the manager re-runs it.
    let fake = start(Config {
        job_delivery: JobDelivery::Direct,
        runner_lost_timeout: Some(Duration::from_millis(300)),
        ..fast_config()
    })
    .await;
    let base = fake.base_url();
    let (tenant, set, session) = scale_set_with_session(&base).await;
    let job = enqueue(&base, json!({"scaleSetId": set})).await[0];
    let (last, messages) = next_acked(&session, 0).await;
    assert_eq!(kinds(&messages), vec!["JobAssigned"]);
    online_runner(&tenant, &base, set, "pod-7").await;
    control_ok(&base, &format!("jobs/{job}/start"), None).await;
    fake.state()
        .wait_for(Duration::from_secs(10), |snapshot| {
            snapshot
                .jobs
                .iter()
                .any(|view| view.request_id == job && view.runner_lost)
        })
        .await
        .expect("the job is failed once its runner stops renewing it");

    let run = job_view(&base, job).await.workflow_run_id;
    let listed = list_jobs(&base, run, "").await;
    let lost = &listed["jobs"][0];
    assert_eq!(
        (&lost["runner_name"], &lost["status"], &lost["conclusion"]),
        (&json!("pod-7"), &json!("completed"), &json!("failure"))
    );
    assert_eq!(
        rerun(&base, lost["id"].as_i64().unwrap(), None)
            .await
            .status(),
        StatusCode::CREATED
    );
    let (_, messages) = next_acked(&session, last).await;
    let assigned: Vec<&Value> = messages
        .iter()
        .filter(|message| message["messageType"] == "JobAssigned")
        .collect();
    assert_eq!(assigned.len(), 1, "{messages:?}");
    let again = assigned[0]["runnerRequestId"].as_i64().unwrap();
    assert_ne!(again, job);
    online_runner(&tenant, &base, set, "pod-8").await;
    let view = job_view(&base, again).await;
    assert_eq!(
        (view.state, view.runner_name.as_deref(), view.run_attempt),
        (JobState::Assigned, Some("pod-8"), 2)
    );
}
