//! The listener end to end: the AutoscalingListener controller's pod, run by the listener-pod executor as the
//! real listener binary with the pod's ServiceAccount token, turns a queued job into EphemeralRunnerSet replicas
//! and EphemeralRunners; a failing listener is recreated and reported.

mod ars_support;

use ars_support::Env;
use crds::EphemeralRunner;
use fake_actions_service::EnqueueJobs;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

#[tokio::test]
async fn a_queued_job_reaches_the_runner_set_through_the_listener() {
    let env = Env::new("al-e2e").await;
    let executor = env.listener_executor();
    let manager = env.start(env.options());
    env.create_runner_set("e2e", env.runner_set_spec()).await;

    env.eventually("ListenerReady=True", || async {
        env.condition("e2e", "ListenerReady")
            .await
            .filter(|c| c.status == "True")
    })
    .await;
    env.eventually("a listener session in the fake", || async {
        env.fake
            .state()
            .snapshot()
            .scale_sets
            .iter()
            .any(|s| s.name == "e2e" && s.session_id.is_some())
            .then_some(())
    })
    .await;

    env.fake
        .state()
        .enqueue_jobs(&EnqueueJobs {
            scale_set_name: Some("e2e".to_owned()),
            count: 2,
            ..EnqueueJobs::default()
        })
        .expect("enqueue");
    env.eventually("replicas raised by the listener", || async {
        let ers = env.ephemeral_runner_sets().get_opt("e2e").await.unwrap()?;
        (ers.spec.replicas == 2).then_some(())
    })
    .await;
    let runners: Api<EphemeralRunner> = env.ctx.api();
    env.eventually("two EphemeralRunners", || async {
        let list = runners.list(&ListParams::default()).await.unwrap().items;
        (list.len() == 2).then_some(())
    })
    .await;
    assert!(executor.errors().is_empty(), "{:?}", executor.errors());
    manager.stop().await;
    executor.stop();
}

#[tokio::test]
async fn a_failing_listener_is_recreated_and_reported() {
    let env = Env::new("al-failing").await;
    let executor = env.listener_executor();
    let mut options = env.options();
    // A log format the listener refuses makes it exit at start-up.
    options.listener.log_format = "xml".to_owned();
    let manager = env.start(options);
    env.create_runner_set("failing", env.runner_set_spec())
        .await;
    let listener = env
        .eventually("the listener", || async {
            env.listeners()
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .next()
        })
        .await
        .name_any();
    env.eventually("ListenerReady=False/ListenerFailing", || async {
        env.condition("failing", "ListenerReady")
            .await
            .filter(|c| c.reason == "ListenerFailing")
    })
    .await;
    env.eventually("a ListenerFailed Event", || async {
        (!env.events("failing", "ListenerFailed").await.is_empty()).then_some(())
    })
    .await;
    // The pod comes back (with backoff), so a transient problem would heal by itself.
    env.eventually("a recreated listener pod", || async {
        env.controller_pods().get_opt(&listener).await.unwrap()
    })
    .await;
    manager.stop().await;
    executor.stop();
}
