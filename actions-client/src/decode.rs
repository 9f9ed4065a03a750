//! Tolerant JSON decoding matching the reference client's decoder
//! (docs/reference/actions-service-protocol.md, "Decoding rules").
//!
//! Go matches object keys to fields case-insensitively and treats `null` like a missing key. serde does neither,
//! so bodies are first parsed into a [`serde_json::Value`], every key that case-insensitively equals a known field
//! name is rewritten to its canonical spelling, and keys holding `null` are removed so `#[serde(default)]` applies.
//! Unknown keys are ignored by serde already; a wrong JSON type still fails the decode, as in Go.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// The UTF-8 byte order mark some service responses start with.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Every JSON key of the protocol models, in the spelling this crate's serde attributes use.
const CANONICAL_KEYS: &[&str] = &[
    "acquireJobUrl",
    "body",
    "count",
    "createdOn",
    "disableUpdate",
    "encodedJITConfig",
    "ephemeral",
    "eventName",
    "expires_at",
    "finishTime",
    "id",
    "isDefaultGroup",
    "isElastic",
    "jobDisplayName",
    "jobId",
    "jobWorkflowRef",
    "labels",
    "message",
    "messageId",
    "messageQueueAccessToken",
    "messageQueueUrl",
    "messageType",
    "name",
    "ownerName",
    "queueTime",
    "repositoryName",
    "requestLabels",
    "result",
    "runner",
    "runnerAssignTime",
    "runnerGroupId",
    "runnerGroupName",
    "runnerId",
    "runnerJitConfigUrl",
    "runnerName",
    "runnerRequestId",
    "runnerScaleSet",
    "runnerScaleSetId",
    "RunnerSetting",
    "runner_event",
    "scaleSetAssignTime",
    "sessionId",
    "size",
    "statistics",
    "token",
    "totalAcquiredJobs",
    "totalAssignedJobs",
    "totalAvailableJobs",
    "totalBusyRunners",
    "totalIdleRunners",
    "totalRegisteredRunners",
    "totalRunningJobs",
    "type",
    "typeName",
    "url",
    "value",
];

/// Removes a leading UTF-8 byte order mark.
pub fn strip_bom(body: &[u8]) -> &[u8] {
    body.strip_prefix(BOM).unwrap_or(body)
}

/// Decodes a response body leniently into `T`.
pub fn from_slice<T: DeserializeOwned>(body: &[u8]) -> Result<T, serde_json::Error> {
    let value: Value = serde_json::from_slice(strip_bom(body))?;
    from_value(value)
}

/// Decodes an already parsed value leniently into `T`.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, serde_json::Error> {
    serde_json::from_value(normalize(value))
}

fn canonical_key(key: String) -> String {
    CANONICAL_KEYS
        .iter()
        .find(|canonical| canonical.eq_ignore_ascii_case(&key))
        .map_or(key, |canonical| (*canonical).to_owned())
}

fn normalize(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::with_capacity(map.len());
            for (key, value) in map {
                if value.is_null() {
                    // Go's decoder treats `null` as "leave the field alone", so skipping the key is equivalent
                    // (an earlier spelling of the same key keeps its value).
                    continue;
                }
                // With two spellings of one key, the later one wins, as with Go's decoder.
                out.insert(canonical_key(key), normalize(value));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.into_iter().map(normalize).collect()),
        other => other,
    }
}

/// serde helpers for Go-style timestamps: RFC 3339 with a zone; the zero time `0001-01-01T00:00:00Z` (Go's
/// default) is read as `None` and written for `None`, because the service always expects the key.
pub mod go_time {
    use jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Go's zero `time.Time` in RFC 3339.
    pub const ZERO: &str = "0001-01-01T00:00:00Z";

    /// Writes `None` as the zero time.
    pub fn serialize<S: Serializer>(
        value: &Option<Timestamp>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(ts) => serializer.collect_str(ts),
            None => serializer.serialize_str(ZERO),
        }
    }

    /// Reads an RFC 3339 time; the zero time and `null` become `None`.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Timestamp>, D::Error> {
        let Some(text) = Option::<String>::deserialize(deserializer)? else {
            return Ok(None);
        };
        let ts: Timestamp = text.parse().map_err(serde::de::Error::custom)?;
        Ok((ts != zero()).then_some(ts))
    }

    fn zero() -> Timestamp {
        // The literal is a valid timestamp within jiff's range; fall back to MIN defensively.
        ZERO.parse().unwrap_or(Timestamp::MIN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(default)]
    struct Sample {
        #[serde(rename = "runnerGroupId")]
        runner_group_id: i64,
        name: String,
        #[serde(rename = "RunnerSetting")]
        setting: Option<Inner>,
    }

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(default)]
    struct Inner {
        #[serde(rename = "disableUpdate")]
        disable_update: bool,
    }

    #[test]
    fn keys_match_case_insensitively_and_nulls_mean_missing() {
        let body = br#"{"RUNNERGROUPID":3,"Name":null,"runnerSetting":{"DisableUpdate":true},"extra":[1]}"#;
        let sample: Sample = from_slice(body).expect("decodes");
        assert_eq!(
            sample,
            Sample {
                runner_group_id: 3,
                name: String::new(),
                setting: Some(Inner {
                    disable_update: true
                }),
            }
        );
    }

    #[test]
    fn bom_is_stripped() {
        let mut body = BOM.to_vec();
        body.extend_from_slice(br#"{"name":"x"}"#);
        let sample: Sample = from_slice(&body).expect("decodes");
        assert_eq!(sample.name, "x");
        assert_eq!(strip_bom(b"abc"), b"abc");
    }

    #[test]
    fn wrong_types_still_fail() {
        assert!(from_slice::<Sample>(br#"{"name":5}"#).is_err());
        assert!(from_slice::<Sample>(br#"{"runnerGroupId":"5"}"#).is_err());
        assert!(from_slice::<Sample>(b"not json").is_err());
    }

    #[derive(Debug, Deserialize, serde::Serialize, PartialEq)]
    struct Timed {
        #[serde(with = "go_time", default)]
        at: Option<jiff::Timestamp>,
    }

    #[test]
    fn go_time_round_trips() {
        let t: Timed = from_slice(br#"{"at":"2025-01-01T13:00:00.000+00:00"}"#).expect("decodes");
        assert_eq!(t.at, Some("2025-01-01T13:00:00Z".parse().expect("ts")));
        let zero: Timed = from_slice(br#"{"at":"0001-01-01T00:00:00Z"}"#).expect("decodes");
        assert_eq!(zero.at, None);
        let missing: Timed = from_slice(br#"{"at":null}"#).expect("decodes");
        assert_eq!(missing.at, None);
        assert_eq!(
            serde_json::to_string(&missing).expect("encodes"),
            r#"{"at":"0001-01-01T00:00:00Z"}"#
        );
        assert!(from_slice::<Timed>(br#"{"at":"yesterday"}"#).is_err());
        assert!(
            from_slice::<Timed>(br#"{"at":"2025-01-01T13:00:00"}"#).is_err(),
            "a zone is required"
        );
    }
}
