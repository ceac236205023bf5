//! The Lua scripts behind the fenced store calls (`renew`, `complete`, `release`).
//!
//! `claim` and `get` need no script: `SET … NX PX … GET` and `GET` are atomic on their own, and
//! keeping large values out of Lua matters. Redis copies every string that enters Lua, from a
//! `redis.call` reply or from `ARGV`, in proportion to its size and on the server's single
//! thread, where a plain `GET` or `SET` copies nothing. So the scripts only ever read the first 49 bytes of a record (`GETRANGE`), and a
//! large response is written by a plain `SET` to a staging key that the script then `RENAME`s.
//!
//! Record values (see the crate documentation):
//! - in flight: `'I'`, token (8 bytes), fingerprint (32 bytes), lease deadline (8 bytes): 49 bytes;
//! - completed: `'E'`, fingerprint (32 bytes), the completing token (8 bytes), the expiry
//!   deadline (8 bytes), the encoded response.
//!
//! A client may resend a script whose reply was lost (redis-rs's cluster client does after a
//! connection error). A completion finding the record already completed by its own token
//! answers 1, as the first attempt did; a renewal is repeatable as it is; a resent release finds
//! nothing and answers 0, which changes nothing.
//!
//! Tokens are compared as the raw 8 bytes, never as Lua numbers: Lua numbers are doubles and would
//! merge tokens above 2^53.
//!
//! Every script that settles a key (completes, releases or forgets it) ends its change with
//! `PUBLISH <channel> <store key>` (the last two `ARGV`s), for waiters in other instances (see
//! `settlements.rs`); only when it changed the record, so a stale or resent call publishes
//! nothing. A plain `PUBLISH`, not a sharded `SPUBLISH`: inside a script a shard channel would
//! have to hash to the record's slot, and a cluster delivers a plain one on every node, so one
//! subscription on any node hears every master.

use std::sync::LazyLock;

use redis::Script;

/// Reads the record's header and checks the token; shared by every script.
/// `ok` is true when `KEYS[1]` is in flight with token `ARGV[1]`; `done` when it is completed
/// by token `ARGV[1]`; `head` holds its first 49 bytes.
const CHECK: &str = r"
local head = redis.call('GETRANGE', KEYS[1], 0, 48)
local ok = string.len(head) == 49 and string.byte(head, 1) == 73
  and string.sub(head, 2, 9) == ARGV[1]
local done = string.len(head) >= 41
  and string.byte(head, 1) == 69
  and string.sub(head, 34, 41) == ARGV[1]
";

fn script(body: &str) -> Script {
    Script::new(&format!("{CHECK}{body}"))
}

/// Extends the lease. `ARGV[2]`: lease in ms; `ARGV[3]`: new deadline (8 bytes).
/// Returns 1 when the token is current, 0 otherwise.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if ok then
  redis.call('SETRANGE', KEYS[1], 41, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
",
    )
});

/// Completes with a small response passed inline. `ARGV[2]`: TTL in ms; `ARGV[3]`: the encoded
/// response; `ARGV[4]`: the expiry deadline (8 bytes); `ARGV[5]`, `ARGV[6]`: the notice's channel
/// and message. The fingerprint comes from the in-flight record (the caller of `complete` does not
/// pass it); `APPEND` after `SET` keeps the expiry and spares Lua a concatenation.
/// Returns 1 when the token is current or already completed the record, 0 otherwise.
pub(crate) static COMPLETE_INLINE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if ok then
  redis.call('SET', KEYS[1], 'E' .. string.sub(head, 10, 41) .. ARGV[1] .. ARGV[4], 'PX', ARGV[2])
  redis.call('APPEND', KEYS[1], ARGV[3])
  redis.call('PUBLISH', ARGV[5], ARGV[6])
  return 1
end
if done then
  return 1
end
return 0
",
    )
});

/// Completes with a large response already written to the staging key `KEYS[2]` as
/// `'E'`, 32 placeholder bytes, the token, the expiry deadline, encoded response. `ARGV[2]`: TTL
/// in ms; `ARGV[3]`, `ARGV[4]`: the notice's channel and message.
/// `RENAME` moves the value without copying it and `SETRANGE` fills in the fingerprint in place.
/// Returns 1 when the token is current or already completed the record, 0 otherwise (the staged
/// value is dropped either way), and 2 when the staging key is missing.
pub(crate) static COMPLETE_STAGED: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if ok then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    return 2
  end
  redis.call('RENAME', KEYS[2], KEYS[1])
  redis.call('SETRANGE', KEYS[1], 1, string.sub(head, 10, 41))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return 1
end
redis.call('DEL', KEYS[2])
if done then
  return 1
end
return 0
",
    )
});

/// Deletes the in-flight record. `ARGV[2]`, `ARGV[3]`: the notice's channel and message.
/// Returns 1 when the token is current, 0 otherwise.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if ok then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
",
    )
});

/// Deletes the record whatever its state (no token check, so no `CHECK`). `ARGV[1]`,
/// `ARGV[2]`: the notice's channel and message. Returns how many keys were deleted.
pub(crate) static FORGET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local deleted = redis.call('DEL', KEYS[1])
if deleted > 0 then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return deleted
",
    )
});

/// All scripts, for preloading.
pub(crate) fn all() -> [&'static Script; 5] {
    [
        &RENEW,
        &COMPLETE_INLINE,
        &COMPLETE_STAGED,
        &RELEASE,
        &FORGET,
    ]
}
