//! The manager's credentials in the suites: the controller chart's ServiceAccount, bound to the RBAC objects the
//! chart renders, so a rule the manager needs and the chart does not grant fails a test instead of a user's
//! install. The suites' clients hold admin credentials; the manager's impersonate the ServiceAccount, and the API
//! server authorizes every request it makes as that account (docs/development.md, "What the tiers run").

use std::path::{Path, PathBuf};
use std::time::Duration;

use chart_tests::{Chart, Template};
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::discovery::Scope;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use test_harness::TestContext;

use crate::world::CONTROLLER_SERVICE_ACCOUNT;
use crate::{Error, Result};

/// How long the authorizer may take to see new bindings (it reads RBAC from its own caches).
const RBAC_IN_FORCE: Duration = Duration::from_secs(30);

/// The manager's credentials, as the controller chart grants them.
pub struct ManagerCredentials {
    /// A client acting as the chart's ServiceAccount, for a manager in this process.
    pub client: Client,
    /// The account's user name, and its groups.
    user: String,
    groups: Vec<String>,
}

impl ManagerCredentials {
    /// Writes a kubeconfig acting as the account into `dir`, for the manager binary: the admin kubeconfig with
    /// `as` and `as-groups`.
    pub fn write_kubeconfig(&self, ctx: &TestContext, dir: &Path) -> Result<PathBuf> {
        let admin = std::fs::read_to_string(ctx.control_plane.kubeconfig_path())
            .map_err(|e| Error::ControlPlane(format!("reading the admin kubeconfig: {e}")))?;
        let mut kubeconfig: Value = serde_json::from_str(&admin)
            .map_err(|e| Error::ControlPlane(format!("the admin kubeconfig: {e}")))?;
        for entry in kubeconfig["users"].as_array_mut().into_iter().flatten() {
            entry["user"]["as"] = json!(self.user);
            entry["user"]["as-groups"] = json!(self.groups);
        }
        let path = dir.join("manager-kubeconfig.json");
        std::fs::write(&path, kubeconfig.to_string())
            .map_err(|e| Error::ControlPlane(format!("writing {}: {e}", path.display())))?;
        Ok(path)
    }
}

/// Creates what the controller chart renders for the manager's identity (its ServiceAccount, ClusterRoles, Roles
/// and their bindings; in single-namespace mode when `watch_single_namespace` is given; `values` on top, e.g.
/// `replicaCount: 2` for the leader-election Role) and returns credentials
/// acting as that account once the API server enforces them. The release name carries the controller namespace,
/// so the cluster-scoped objects of two worlds on one control plane do not collide.
pub async fn install(
    ctx: &TestContext,
    controller_namespace: &str,
    watch_single_namespace: Option<&str>,
    values: &Value,
) -> Result<ManagerCredentials> {
    let manifests = Template::new(Chart::Controller)
        .release(&format!("r-{controller_namespace}"))
        .namespace(controller_namespace)
        .values(json!({
            "serviceAccount": {"name": CONTROLLER_SERVICE_ACCOUNT},
            "flags": {"watchSingleNamespace": watch_single_namespace.unwrap_or_default()},
        }))
        .values(values.clone())
        .render()?;
    let identity = manifests.objects().iter().filter(|object| {
        matches!(
            object["kind"].as_str(),
            Some("ServiceAccount" | "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding")
        )
    });
    let mut created = 0;
    for object in identity {
        create(&ctx.client, object, controller_namespace).await?;
        created += 1;
    }
    if created == 0 {
        return Err(Error::ControlPlane(
            "the controller chart rendered no RBAC objects".to_owned(),
        ));
    }

    let user = format!("system:serviceaccount:{controller_namespace}:{CONTROLLER_SERVICE_ACCOUNT}");
    let groups = vec![
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{controller_namespace}"),
        "system:authenticated".to_owned(),
    ];
    let mut config = ctx.control_plane.config().clone();
    config.auth_info.impersonate = Some(user.clone());
    config.auth_info.impersonate_groups = Some(groups.clone());
    let client = Client::try_from(config)
        .map_err(|e| Error::ControlPlane(format!("a client acting as {user}: {e}")))?;

    wait_in_force(&client, &user, watch_single_namespace, controller_namespace).await?;
    Ok(ManagerCredentials {
        client,
        user,
        groups,
    })
}

/// Creates one rendered object where the chart puts it (`namespace` when it names none).
async fn create(client: &Client, object: &Value, namespace: &str) -> Result<()> {
    let what = format!(
        "{}/{}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["name"].as_str().unwrap_or("?")
    );
    let invalid = |reason: &str| Error::InvalidObject {
        what: what.clone(),
        reason: reason.to_owned(),
    };
    let api_version = object["apiVersion"]
        .as_str()
        .ok_or_else(|| invalid("no apiVersion"))?;
    let kind = object["kind"].as_str().ok_or_else(|| invalid("no kind"))?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk).await?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or(namespace),
            &resource,
        ),
    };
    let object: DynamicObject =
        serde_json::from_value(object.clone()).map_err(|e| invalid(&e.to_string()))?;
    api.create(&PostParams::default(), &object).await?;
    tracing::debug!(object = %what, name = %object.name_any(), "created the manager's RBAC object");
    Ok(())
}

/// Waits until the account may do what the manager does first: list the scale sets it watches and the listeners
/// in its own namespace.
async fn wait_in_force(
    client: &Client,
    user: &str,
    watched: Option<&str>,
    controller_namespace: &str,
) -> Result<()> {
    let sets: Api<crds::AutoscalingRunnerSet> = match watched {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let listeners: Api<crds::AutoscalingListener> =
        Api::namespaced(client.clone(), controller_namespace);
    let deadline = tokio::time::Instant::now() + RBAC_IN_FORCE;
    loop {
        let sets_listed = sets.list(&ListParams::default().limit(1)).await;
        let listeners_listed = listeners.list(&ListParams::default().limit(1)).await;
        match (sets_listed, listeners_listed) {
            (Ok(_), Ok(_)) => return Ok(()),
            (sets, listeners) if tokio::time::Instant::now() >= deadline => {
                return Err(Error::ControlPlane(format!(
                    "the controller chart's RBAC for {user} not in force after {RBAC_IN_FORCE:?}: \
                     scale sets {:?}, listeners {:?}",
                    sets.err(),
                    listeners.err()
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
