#!/usr/bin/env bash
# A new application's dependency set, resolved and built: sqlx 0.9 (SQLite and Postgres, tokio),
# rusqlite 0.43 (bundled) and tower-idempotency from this checkout with its default features.
# Fails unless it resolves, builds, and its lockfile holds exactly one `sqlx` and one
# `libsqlite3-sys` (cargo's `links = "sqlite3"` rule allows no second one).
#
#   scripts/scratch-app.sh      (the app lives in a temp dir; it builds in this workspace's target
#                                directory, or CARGO_TARGET_DIR, to reuse the crates compiled there)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
app=$(mktemp -d)
trap 'rm -rf "$app"' EXIT
mkdir -p "$app/src"
cat >"$app/Cargo.toml" <<TOML
[package]
name = "scratch-app"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
sqlx = { version = "0.9", features = ["runtime-tokio", "sqlite", "postgres"] }
rusqlite = { version = "0.43", features = ["bundled"] }
tower-idempotency = { path = "$root" }
tokio = { version = "1", features = ["rt", "macros"] }

[workspace]
TOML
cat >"$app/src/main.rs" <<'RS'
//! Opens one in-memory SQLite database through each of the three libraries sharing one SQLite.
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let direct = rusqlite::Connection::open_in_memory().expect("rusqlite");
    let version: String = direct
        .query_row("SELECT sqlite_version()", [], |row| row.get(0))
        .expect("version");
    let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.expect("sqlx");
    let through_sqlx: String = sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(&pool)
        .await
        .expect("version");
    assert_eq!(version, through_sqlx);
    let store = tower_idempotency::SqliteStore::connect("sqlite::memory:")
        .await
        .expect("store");
    store.migrate().await.expect("migrate");
    println!("one SQLite {version} for rusqlite, sqlx and the store");
}
RS
cargo generate-lockfile --manifest-path "$app/Cargo.toml"
count() { grep -c "^name = \"$1\"$" "$app/Cargo.lock" || true; }
for crate in sqlx libsqlite3-sys; do
  n=$(count "$crate")
  echo "$crate: $n in the lockfile"
  [ "$n" = 1 ] || { echo "FATAL: the scratch application resolves $n versions of $crate"; exit 1; }
done
cargo run --quiet --manifest-path "$app/Cargo.toml"
