//! Keeping the scale set's labels in the Actions Service in step with `runnerScaleSetLabels` (not in ARC, which
//! sets them only when it creates the scale set; docs/configuration.md, "Scale set labels").
//!
//! The labels last known to be in the service are recorded on the AutoscalingRunnerSet in
//! [`SCALE_SET_LABELS_ANNOTATION`] (a JSON list of names). When the wanted list differs from that record, the
//! scale set is read; if its labels differ too, they are replaced with one update call (the service replaces the
//! whole list). Either way the record is written, so the service is asked once per change. The record is also
//! written when the scale set is created or adopted; a set created by ARC (no record yet) costs one read, and no
//! update when its labels already match.

use actions_client::{Label, RunnerScaleSet};
use crds::AutoscalingRunnerSet;
use crds::constants::SCALE_SET_LABELS_ANNOTATION;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::desired::scale_set_labels;
use crate::actions::Actions;
use crate::error::Result;

/// The labels the scale set should carry (its name, then each `runnerScaleSetLabels` entry once), when they
/// differ from the recorded ones; `None` when the record matches.
pub fn pending(runner_set: &AutoscalingRunnerSet, scale_set_name: &str) -> Option<Vec<Label>> {
    let wanted = scale_set_labels(scale_set_name, &runner_set.spec.runner_scale_set_labels);
    let recorded: Option<Vec<String>> = runner_set
        .annotations()
        .get(SCALE_SET_LABELS_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok());
    (recorded.as_deref() != Some(names(&wanted).as_slice())).then_some(wanted)
}

fn names(labels: &[Label]) -> Vec<String> {
    labels.iter().map(|label| label.name.clone()).collect()
}

/// The annotation value recording `labels` (the names, in order, as a JSON list); written when the scale set is
/// created or adopted, with the labels the service reported.
pub fn record_text(labels: &[Label]) -> String {
    serde_json::to_string(&names(labels)).unwrap_or_default()
}

/// What [`push`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    /// The service already had these labels.
    AlreadySet(Vec<String>),
    /// The labels were replaced.
    Updated {
        /// Before.
        from: Vec<String>,
        /// After.
        to: Vec<String>,
    },
}

impl Pushed {
    /// The merge patch recording the labels on the AutoscalingRunnerSet.
    pub fn record(&self) -> Value {
        let names = match self {
            Self::AlreadySet(names) | Self::Updated { to: names, .. } => names,
        };
        let text = serde_json::to_string(names).unwrap_or_default();
        json!({"metadata": {"annotations": {SCALE_SET_LABELS_ANNOTATION: text}}})
    }

    /// The Event note for an update; `None` when nothing changed in the service.
    pub fn note(&self, scale_set_id: i64) -> Option<String> {
        match self {
            Self::AlreadySet(_) => None,
            Self::Updated { from, to } => Some(format!(
                "runner scale set {scale_set_id} labels changed from [{}] to [{}]",
                from.join(", "),
                to.join(", ")
            )),
        }
    }
}

/// Reads scale set `id` and replaces its labels with `wanted` if they differ (names compared, in any order and
/// case-sensitively, as `runs-on` matches them).
pub async fn push(actions: &Actions, id: i64, wanted: Vec<Label>) -> Result<Pushed> {
    let current = actions
        .get_scale_set_by_id(id)
        .await?
        .map(|set| names(&set.labels))
        .unwrap_or_default();
    let wanted_names = names(&wanted);
    let mut sorted_current = current.clone();
    let mut sorted_wanted = wanted_names.clone();
    sorted_current.sort();
    sorted_wanted.sort();
    if sorted_current == sorted_wanted {
        return Ok(Pushed::AlreadySet(wanted_names));
    }
    let updated = actions
        .update_scale_set(
            id,
            &RunnerScaleSet {
                labels: wanted,
                ..RunnerScaleSet::default()
            },
        )
        .await?;
    Ok(Pushed::Updated {
        from: current,
        to: names(&updated.labels),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::AutoscalingRunnerSetSpec;
    use std::collections::BTreeMap;

    fn set(labels: &[&str], recorded: Option<&str>) -> AutoscalingRunnerSet {
        let mut set = AutoscalingRunnerSet::new(
            "set",
            AutoscalingRunnerSetSpec {
                runner_scale_set_labels: labels.iter().map(|l| (*l).to_owned()).collect(),
                ..AutoscalingRunnerSetSpec::default()
            },
        );
        if let Some(text) = recorded {
            set.metadata.annotations = Some(BTreeMap::from([(
                SCALE_SET_LABELS_ANNOTATION.to_owned(),
                text.to_owned(),
            )]));
        }
        set
    }

    #[test]
    fn a_change_of_the_labels_or_the_name_is_pending_until_recorded() {
        // No record (a set made before this feature, or by ARC): check once.
        let wanted = pending(&set(&["linux"], None), "set").unwrap();
        assert_eq!(names(&wanted), ["set", "linux"]);
        assert!(wanted.iter().all(|l| l.label_type == "System"));
        assert_eq!(
            pending(&set(&["linux"], Some(r#"["set","linux"]"#)), "set"),
            None
        );
        // Duplicates and the name itself are listed once, as at creation.
        assert_eq!(
            pending(
                &set(&["linux", "set", "linux"], Some(r#"["set","linux"]"#)),
                "set"
            ),
            None
        );
        assert!(pending(&set(&["linux", "gpu"], Some(r#"["set","linux"]"#)), "set").is_some());
        assert!(pending(&set(&[], Some(r#"["set","linux"]"#)), "set").is_some());
        assert!(pending(&set(&["linux"], Some(r#"["set","linux"]"#)), "renamed").is_some());
        // An unreadable record counts as none.
        assert!(pending(&set(&["linux"], Some("set,linux")), "set").is_some());
    }

    #[test]
    fn the_record_and_the_event_text() {
        let pushed = Pushed::Updated {
            from: vec!["set".into(), "linux".into()],
            to: vec!["set".into(), "gpu".into()],
        };
        assert_eq!(
            pushed.record(),
            json!({"metadata": {"annotations": {SCALE_SET_LABELS_ANNOTATION: r#"["set","gpu"]"#}}})
        );
        assert_eq!(
            pushed.note(7).as_deref(),
            Some("runner scale set 7 labels changed from [set, linux] to [set, gpu]")
        );
        assert_eq!(Pushed::AlreadySet(vec!["set".into()]).note(7), None);
    }
}
