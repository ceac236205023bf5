//! Which keys this process has claimed lately: it decides a claim's first statement.
//!
//! A claim of a key this process has seen is probably a replay or an in-flight duplicate, which
//! a plain primary-key read answers: on SQLite on a reader connection, without the writer; on
//! Postgres without the claim statement's upsert plan. A claim of a key it has not seen is
//! probably new, which a plain `INSERT .. ON CONFLICT DO NOTHING` claims, the cheapest write
//! there is. Either guess is only a choice of order: the claim statement, which runs whenever the
//! guess was wrong, handles every state of the row, so a wrong guess costs one statement, never
//! a wrong answer.

use std::{
    collections::{hash_map::RandomState, HashSet},
    hash::BuildHasher,
    sync::Mutex,
};

/// Keys per generation; two generations are kept, so the memory stays under a megabyte.
const GENERATION: usize = 32_768;

/// A bounded set of key hashes, forgotten a generation at a time.
#[derive(Debug, Default)]
pub(crate) struct RecentKeys {
    hasher: RandomState,
    generations: Mutex<Generations>,
}

#[derive(Debug, Default)]
struct Generations {
    current: HashSet<u64>,
    previous: HashSet<u64>,
}

impl RecentKeys {
    /// Whether `key` was seen since about the last [`GENERATION`] keys; records it either way.
    pub(crate) fn seen(&self, key: &str) -> bool {
        let hash = self.hasher.hash_one(key);
        // A poisoned lock only means another claim panicked while holding these sets of
        // hashes, which are valid at every step.
        let mut generations = self
            .generations
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if generations.current.contains(&hash) {
            return true;
        }
        let seen = generations.previous.contains(&hash);
        if generations.current.len() >= GENERATION {
            let full = std::mem::take(&mut generations.current);
            generations.previous = full;
        }
        generations.current.insert(hash);
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_seen_after_its_first_claim() {
        let recent = RecentKeys::default();
        assert!(!recent.seen("a"));
        assert!(recent.seen("a"));
        assert!(!recent.seen("b"));
    }

    #[test]
    fn old_keys_are_forgotten_after_two_generations() {
        let recent = RecentKeys::default();
        recent.seen("old");
        for i in 0..GENERATION {
            recent.seen(&i.to_string());
        }
        // "old" is in the previous generation now, and seeing it moves it forward.
        assert!(recent.seen("old"));
        for i in GENERATION..3 * GENERATION {
            recent.seen(&i.to_string());
        }
        assert!(!recent.seen("old"));
        let generations = recent.generations.lock().unwrap();
        assert!(generations.current.len() <= GENERATION);
        assert!(generations.previous.len() <= GENERATION);
    }
}
