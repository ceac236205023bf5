//! The `tower-idempotency` tool reaches Postgres over TLS (`sslmode` in the store URL): against
//! a throw-away Postgres cluster of the test's own (initdb and pg_ctl in a temporary directory,
//! on a reserved loopback port) that accepts TLS connections only, with a certificate signed by
//! a CA the test made.

mod support;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use serde_json::Value;
use support::*;
use tower_idempotency::PostgresStore;
use tower_idempotency_testkit::{ReservedPort, TestCertificates};

/// A Postgres cluster of our own, in a temporary directory, stopped and removed on drop.
struct TlsPostgres {
    bin: PathBuf,
    dir: PathBuf,
    port: ReservedPort,
    ca: PathBuf,
}

impl TlsPostgres {
    /// Starts one that accepts TLS connections only (`hostssl` in pg_hba.conf), or says why not.
    fn start() -> Result<Self, String> {
        let bin = postgres_bin().ok_or("no /usr/lib/postgresql/*/bin/initdb")?;
        let dir = std::env::temp_dir().join(format!("tidem-pg-tls-{}", random_suffix()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("no directory ({e})"))?;
        let files = TestCertificates::generate()
            .write(&dir)
            .map_err(|e| format!("cannot write the certificates ({e})"))?;
        let server = Self {
            bin,
            dir,
            port: ReservedPort::new(),
            ca: files.ca,
        };
        // initdb refuses to run as root: the cluster then belongs to the `postgres` user.
        if as_root() {
            run("chown", &["-R", "postgres:", &server.path("")])?;
        }
        let data = server.path("data");
        server.run_as_owner(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        std::fs::write(
            server.dir.join("data/pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )
        .map_err(|e| format!("cannot write pg_hba.conf ({e})"))?;
        let options = format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories={} -c ssl=on \
             -c ssl_cert_file={} -c ssl_key_file={} -c fsync=off",
            server.port.port(),
            server.path(""),
            files.cert.display(),
            files.key.display(),
        );
        let log = server.path("postgres.log");
        server.run_as_owner(
            "pg_ctl",
            &[
                "-D", &data, "-l", &log, "-w", "-t", "60", "-o", &options, "start",
            ],
        )?;
        Ok(server)
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// Runs one of the server's binaries as the cluster's owner.
    fn run_as_owner(&self, binary: &str, args: &[&str]) -> Result<(), String> {
        let binary = self.bin.join(binary).display().to_string();
        if as_root() {
            let mut all = vec!["-u", "postgres", "--", binary.as_str()];
            all.extend_from_slice(args);
            run("runuser", &all)
        } else {
            run(&binary, args)
        }
    }

    /// `postgres://` to its `postgres` database with the given query.
    fn url(&self, query: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?{query}",
            self.port.port()
        )
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let data = self.path("data");
        let _ = self.run_as_owner("pg_ctl", &["-D", &data, "-m", "immediate", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `bin` directory of the newest installed Postgres with an `initdb`.
fn postgres_bin() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    found.sort_by_key(|bin| {
        bin.parent()
            .and_then(Path::file_name)
            .and_then(|v| v.to_str()?.parse::<u32>().ok())
    });
    found.pop()
}

fn as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program} ({e})"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// `purge-expired --json` on the table `table` of the store at `url`.
async fn purge(url: &str, table: &str) -> Output {
    cli(&["--store", url, "--table", table, "--json", "purge-expired"]).await
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reaches_a_tls_only_postgres_that_verifies_against_its_ca() {
    let server = match TlsPostgres::start() {
        Ok(server) => server,
        Err(why) => return skip("a throw-away TLS Postgres", &why),
    };
    let ca = server.ca.display().to_string();
    let verified = server.url(&format!("sslmode=verify-full&sslrootcert={ca}"));
    let table = format!("tidem_cli_tls_{}", random_suffix());
    PostgresStore::connect_with_table(&verified, &table)
        .await
        .expect("the store over TLS")
        .migrate()
        .await
        .expect("its table");

    let output = purge(&verified, &table).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let purged: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(purged["store"], "postgres", "{purged}");
    assert_eq!(purged["purged"], 0, "{purged}");

    // The server refuses a connection without TLS.
    let plain = purge(&server.url("sslmode=disable"), &table).await;
    assert!(!plain.status.success());
    assert!(
        stderr(&plain).contains("no encryption"),
        "{}",
        stderr(&plain)
    );

    // The certificate is checked: the system's roots do not hold the test CA.
    let unverified = purge(&server.url("sslmode=verify-full"), &table).await;
    assert!(!unverified.status.success());
    assert!(
        stderr(&unverified).contains("UnknownIssuer"),
        "{}",
        stderr(&unverified)
    );
}
