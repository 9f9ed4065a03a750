//! Reading an encoded JIT config the way a runner does: base64 of a JSON object whose `.runner` entry is
//! base64 of the runner file.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::constants::{JIT_FAKE_CONTROL_URL, JIT_RUNNER_FILE};
use crate::{Error, Result};

/// The runner file inside an encoded JIT config.
pub fn runner_file(encoded: &str) -> Result<serde_json::Value> {
    let bad = |what: String| Error::JitConfig(what);
    let outer = BASE64
        .decode(encoded.trim())
        .map_err(|e| bad(format!("not base64: {e}")))?;
    let outer: serde_json::Value =
        serde_json::from_slice(&outer).map_err(|e| bad(format!("not JSON: {e}")))?;
    let runner = outer[JIT_RUNNER_FILE]
        .as_str()
        .ok_or_else(|| bad(format!("no `{JIT_RUNNER_FILE}` entry")))?;
    let runner = BASE64
        .decode(runner)
        .map_err(|e| bad(format!("`{JIT_RUNNER_FILE}` is not base64: {e}")))?;
    serde_json::from_slice(&runner)
        .map_err(|e| bad(format!("`{JIT_RUNNER_FILE}` is not JSON: {e}")))
}

/// The fake's control API URL the JIT config names (the fake adds it for stand-in runners).
pub fn fake_control_url(encoded: &str) -> Result<String> {
    runner_file(encoded)?[JIT_FAKE_CONTROL_URL]
        .as_str()
        .map(|url| url.trim_end_matches('/').to_owned())
        .ok_or_else(|| {
            Error::JitConfig(format!(
                "the runner file has no `{JIT_FAKE_CONTROL_URL}`: this runner only works with the fake"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn encode(value: &serde_json::Value) -> String {
        BASE64.encode(value.to_string())
    }

    #[test]
    fn the_control_url_comes_from_the_runner_file() {
        let runner = json!({"agentId": 3, "fakeControlUrl": "http://127.0.0.1:5/_fake/"});
        let jit = encode(&json!({".runner": encode(&runner), ".credentials": "x"}));
        assert_eq!(fake_control_url(&jit).unwrap(), "http://127.0.0.1:5/_fake");
    }

    #[test]
    fn broken_configs_are_named() {
        for (jit, says) in [
            ("%%%".to_owned(), "not base64"),
            (BASE64.encode("nope"), "not JSON"),
            (encode(&json!({})), "no `.runner`"),
            (
                encode(&json!({".runner": encode(&json!({"agentId": 1}))})),
                "fakeControlUrl",
            ),
        ] {
            let error = fake_control_url(&jit).unwrap_err().to_string();
            assert!(error.contains(says), "{error}");
        }
    }
}
