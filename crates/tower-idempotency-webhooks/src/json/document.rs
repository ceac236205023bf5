//! The document handed to handlers: a [`Value`], the first of repeated object keys kept.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// A JSON document as a [`Value`], the first of repeated object keys kept.
pub(crate) struct Document;

impl<'de> DeserializeSeed<'de> for Document {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Document {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Document)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(Document)?;
            merge(&mut object, key, value);
        }
        Ok(Value::Object(object))
    }
}

/// Adds `key: value` to `object` as the field reader sees repeated keys: the first value
/// wins, except that two objects under one key are merged (the field reader finds a field
/// in either), again first wins inside.
fn merge(object: &mut Map<String, Value>, key: String, value: Value) {
    match (object.get_mut(&key), value) {
        (None, value) => {
            object.insert(key, value);
        }
        (Some(Value::Object(first)), Value::Object(later)) => {
            for (key, value) in later {
                merge(first, key, value);
            }
        }
        (Some(_), _) => {}
    }
}
