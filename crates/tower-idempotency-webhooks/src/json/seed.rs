//! The serde_json visitor behind [`fields_until`](super::fields_until): it walks the
//! document along the requested pointers, records the scalars at their ends, and skips the rest.

use std::{borrow::Cow, cell::Cell, fmt};

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::Scalar;

/// Deepest pointer the scan reads (the providers' go three levels down).
pub(super) const MAX_DEPTH: usize = 4;

/// A JSON pointer of object keys, split into its segments.
pub(super) struct Path<'p> {
    pub(super) segments: [&'p str; MAX_DEPTH],
    pub(super) len: usize,
}

impl<'p> Path<'p> {
    pub(super) fn new(pointer: &'p str) -> Self {
        let mut path = Self {
            segments: [""; MAX_DEPTH],
            len: 0,
        };
        for segment in pointer.split('/').skip(1) {
            assert!(path.len < MAX_DEPTH, "JSON pointer {pointer} is too deep");
            path.segments[path.len] = segment;
            path.len += 1;
        }
        path
    }
}

/// Bit `i` of `mask`, for each `i` set, lowest first.
fn bits(mut mask: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        let bit = mask.trailing_zeros() as usize;
        (mask != 0).then(|| {
            mask &= mask - 1;
            bit
        })
    })
}

/// The visitor of one value at `depth`, reached by the first `depth` segments of the
/// `candidates` paths.
pub(super) struct Seed<'s, 'p> {
    pub(super) depth: usize,
    pub(super) paths: &'s [Path<'p>],
    /// The paths whose first `depth` segments led here.
    pub(super) candidates: u32,
    pub(super) out: &'s mut [Option<Scalar>],
    pub(super) done: &'s dyn Fn(&[Option<Scalar>]) -> bool,
    pub(super) stopped: &'s Cell<bool>,
}

/// Records `value()` for every path among `candidates` that ends at `depth` and has no
/// value yet (the first of repeated keys wins); `value` runs only if one does.
fn record(
    paths: &[Path<'_>],
    depth: usize,
    candidates: u32,
    out: &mut [Option<Scalar>],
    value: impl FnOnce() -> Scalar,
) {
    let ending = bits(candidates)
        .filter(|&i| paths[i].len == depth && out[i].is_none())
        .fold(0u32, |mask, i| mask | 1 << i);
    if ending == 0 {
        return;
    }
    // The value moves into the last path that ends here; any others get copies.
    let value = value();
    let last = 31 - ending.leading_zeros() as usize;
    for index in bits(ending & !(1 << last)) {
        out[index] = Some(value.clone());
    }
    out[last] = Some(value);
}

impl Seed<'_, '_> {
    fn set(&mut self, value: Scalar) {
        record(self.paths, self.depth, self.candidates, self.out, || value);
    }
}

impl<'de> DeserializeSeed<'de> for Seed<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

struct Key<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

impl<'de> Visitor<'de> for Seed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E>(mut self, v: &str) -> Result<(), E> {
        self.set(Scalar::Str(v.to_owned()));
        Ok(())
    }

    fn visit_u64<E>(mut self, v: u64) -> Result<(), E> {
        self.set(Scalar::U64(v));
        Ok(())
    }

    fn visit_i64<E>(mut self, v: i64) -> Result<(), E> {
        self.set(if v >= 0 {
            Scalar::U64(v.unsigned_abs())
        } else {
            Scalar::I64(v)
        });
        Ok(())
    }

    fn visit_f64<E>(mut self, v: f64) -> Result<(), E> {
        self.set(Scalar::Float(v.to_bits()));
        Ok(())
    }

    fn visit_bool<E>(mut self, _: bool) -> Result<(), E> {
        self.set(Scalar::Other);
        Ok(())
    }

    fn visit_unit<E>(mut self) -> Result<(), E> {
        self.set(Scalar::Other);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.set(Scalar::Other);
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.set(Scalar::Other);
        let depth = self.depth;
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            let children = bits(self.candidates)
                .filter(|&i| {
                    let path = &self.paths[i];
                    path.len > depth && path.segments[depth] == key.as_ref()
                })
                .fold(0u32, |mask, i| mask | 1 << i);
            if children == 0 {
                map.next_value::<IgnoredAny>()?;
            } else {
                map.next_value_seed(Seed {
                    depth: depth + 1,
                    paths: self.paths,
                    candidates: children,
                    out: self.out,
                    done: self.done,
                    stopped: self.stopped,
                })?;
                if self.stopped.get() || (self.done)(self.out) {
                    // Everything needed is read: abandon the parse. Returning early leaves
                    // the object unfinished, so serde_json usually fails the enclosing parse
                    // with its own syntax error (none when the field was the object's last
                    // member); the caller treats either as success. (A custom error would
                    // format a message and search it for a position on every delivery.)
                    self.stopped.set(true);
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}
