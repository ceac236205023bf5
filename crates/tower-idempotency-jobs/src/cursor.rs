//! A listing's cursor: the last listed job's position (enqueue time and key) as hex of a JSON
//! array, opaque to callers.

use crate::JobKey;

/// The cursor after a job enqueued at `created_at_ms` under `key`.
pub fn encode(created_at_ms: i64, key: &JobKey) -> String {
    let mut parts = vec![serde_json::Value::from(created_at_ms)];
    parts.extend(
        key.0
            .iter()
            .map(|part| serde_json::Value::from(part.as_str())),
    );
    hex::encode(serde_json::Value::Array(parts).to_string())
}

/// The position a cursor of [`encode`] names, when it has `key_len` key parts; `None` for text
/// [`encode`] did not make.
pub fn decode(cursor: &str, key_len: usize) -> Option<(i64, JobKey)> {
    let bytes = hex::decode(cursor).ok()?;
    let parts: Vec<serde_json::Value> = serde_json::from_slice(&bytes).ok()?;
    let (first, rest) = parts.split_first()?;
    if rest.len() != key_len {
        return None;
    }
    let key = rest
        .iter()
        .map(|part| part.as_str().map(str::to_owned))
        .collect::<Option<Vec<_>>>()?;
    Some((first.as_i64()?, JobKey(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_a_forged_one_is_refused() {
        let key = JobKey(vec!["stripe".into(), "evt_\"1".into()]);
        let cursor = encode(42, &key);
        assert_eq!(decode(&cursor, 2), Some((42, key)));
        assert_eq!(decode(&cursor, 1), None);
        assert_eq!(decode("zz", 2), None);
        assert_eq!(decode(&hex::encode("[1]"), 2), None);
        assert_eq!(decode(&hex::encode("[\"a\", \"b\"]"), 1), None);
    }
}
