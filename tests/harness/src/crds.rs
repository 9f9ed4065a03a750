//! Installing CustomResourceDefinitions into the test control plane.

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

use crate::Error;

/// Field manager of the harness's server-side applies.
pub const FIELD_MANAGER: &str = "arc-rs-test-harness";

const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(60);

/// Server-side applies each CRD and waits until the API server reports it Established.
///
/// Idempotent, so every test that needs the CRDs can call it, even concurrently.
pub async fn apply_crds(client: &Client, crds: &[CustomResourceDefinition]) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        let mut crd = crd.clone();
        // Applying an object read back from the server would carry these; a generated one never does.
        crd.metadata.managed_fields = None;
        crd.metadata.resource_version = None;
        api.patch(&crd.name_any(), &params, &Patch::Apply(&crd))
            .await
            .map_err(Error::Kube)?;
    }
    for crd in crds {
        wait_established(&api, &crd.name_any()).await?;
    }
    Ok(())
}

async fn wait_established(api: &Api<CustomResourceDefinition>, name: &str) -> Result<(), Error> {
    let deadline = Instant::now() + ESTABLISH_TIMEOUT;
    while Instant::now() < deadline {
        let crd = api.get(name).await.map_err(Error::Kube)?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::CrdNotEstablished {
        name: name.to_owned(),
        timeout: ESTABLISH_TIMEOUT,
    })
}
