#!/usr/bin/env python3
"""What the databases alone allow: the SQL stores' statements against the load harness's
floors (a new key's two writes; on Postgres also a replay's read), with no layer and no HTTP, so
the database's share of a gap can be told from the layer's (docs/benchmarks.md, "What bounds
the numbers").

    bench/scripts/statement-ceilings.py sqlite      # Python's sqlite3 on a scratch file: µs per pair
    bench/scripts/statement-ceilings.py postgres    # pgbench on DATABASE_URL's database: tps

The statements are copies of crates/tower-idempotency-sqlx/src/{sqlite,postgres}.rs with literal
values; the variants (no index, partial index, several pairs per transaction) are the
experiments the docs cite. Every table is dropped at the end.
"""
import os, random, subprocess, sys, tempfile, time

CLAIM_SET = ", ".join(
    f"{c} = CASE WHEN {{old}}expires_at <= {{now}} THEN {{new}}{c} ELSE {{old}}{c} END"
    for c in ["fingerprint", "token", "state", "expires_at"])


def sqlite():
    import sqlite3
    table = ("CREATE TABLE t (key TEXT PRIMARY KEY NOT NULL, fingerprint BLOB NOT NULL, token INTEGER"
             " NOT NULL, state INTEGER NOT NULL, expires_at INTEGER NOT NULL, status INTEGER,"
             " headers BLOB, body BLOB, body_omitted INTEGER NOT NULL DEFAULT 0);")
    index = "CREATE INDEX t_exp ON t (expires_at)"
    claim = ("INSERT INTO t (key, fingerprint, token, state, expires_at) VALUES (?1, ?2, ?3, 0, ?5)"
             " ON CONFLICT (key) DO UPDATE SET "
             + CLAIM_SET.format(old="", now="?4", new="excluded.")
             + " RETURNING token, fingerprint, state, expires_at, status, headers, body, body_omitted")
    insert = ("INSERT INTO t (key, fingerprint, token, state, expires_at)"
              " VALUES (?1, ?2, ?3, 0, ?5) ON CONFLICT (key) DO NOTHING")
    complete = ("UPDATE t SET state = 1, status = ?3, headers = ?4, body = ?5, body_omitted = 0,"
                " expires_at = ?6 WHERE key = ?1 AND token = ?2 AND state = 0")
    # name: (DDL, first statement, pairs per transaction); None is the floor.
    cases = {
        "floor (INSERT + UPDATE, primary key only)": ("CREATE TABLE t (key TEXT PRIMARY KEY, state INTEGER NOT NULL, body BLOB);", None, 1),
        "store: claim statement + complete": (table + index, claim, 1),
        "store: plain insert + complete": (table + index, insert, 1),
        "store, no expires_at index": (table, insert, 1),
        "store, index partial (WHERE state = 1)": (table + index + " WHERE state = 1", insert, 1),
        "store, 4 pairs per transaction": (table + index, insert, 4),
        "store, 16 pairs per transaction": (table + index, insert, 16),
    }
    fingerprint, body, headers = os.urandom(32), os.urandom(1024), b"h" * 60
    directory = tempfile.mkdtemp(prefix="ceilings-")
    results = {}
    for round_ in range(3):
        for n, (name, (ddl, first, batch)) in enumerate(cases.items()):
            path = os.path.join(directory, f"{n}.db")
            if round_ == 0:
                c = sqlite3.connect(path, isolation_level=None)
                c.execute("PRAGMA journal_mode = WAL")
                c.executescript(ddl + ";")
                c.close()
            c = sqlite3.connect(path, isolation_level=None)
            c.execute("PRAGMA synchronous = NORMAL")
            pairs = 10_000
            keys = [f"k{round_}-{i}-{random.getrandbits(40)}" for i in range(pairs)]
            started = time.perf_counter()
            for i in range(0, pairs, batch):
                if batch > 1:
                    c.execute("BEGIN IMMEDIATE")
                for key in keys[i:i + batch]:
                    if first is None:
                        c.execute("INSERT INTO t (key, state) VALUES (?1, 0)", (key,))
                        c.execute("UPDATE t SET state = 1, body = ?2 WHERE key = ?1", (key, body))
                    else:
                        list(c.execute(first, (key, fingerprint, 7, 1000, 31000)))
                        c.execute(complete, (key, 7, 201, headers, body, 86_401_000))
                if batch > 1:
                    c.execute("COMMIT")
            results.setdefault(name, []).append((time.perf_counter() - started) / pairs * 1e6)
            c.close()
    for name, runs in results.items():
        runs.sort()
        print(f"{name:45} {runs[1]:6.1f} µs per pair (runs {', '.join(f'{r:.1f}' for r in runs)})")
    subprocess.run(["rm", "-rf", directory], check=True)


def postgres():
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
    suffix = random.getrandbits(32)
    store, bare, noidx = f"ceil_store_{suffix}", f"ceil_floor_{suffix}", f"ceil_noidx_{suffix}"
    columns = ("(key text COLLATE \"C\" PRIMARY KEY, fingerprint bytea NOT NULL, token bigint NOT NULL,"
               " state smallint NOT NULL, expires_at timestamptz NOT NULL, status smallint,"
               " headers bytea, body bytea, body_omitted boolean NOT NULL DEFAULT false,"
               " watched boolean NOT NULL DEFAULT false) WITH (fillfactor = 80)")
    key = "'k' || :client_id || '-' || :r"
    fp = "'\\x" + "ab" * 32 + "'::bytea"
    ddl = (f"CREATE TABLE {store} {columns}; CREATE INDEX ON {store} (expires_at);"
           f" CREATE TABLE {noidx} {columns};"
           f" CREATE TABLE {bare} (key text COLLATE \"C\" PRIMARY KEY, state smallint NOT NULL,"
           f" body bytea) WITH (fillfactor = 80);"
           # Rows for the read cases: completed records with a 1 KiB body.
           f" INSERT INTO {bare} SELECT 'r' || g, 1, repeat('x', 1024)::bytea"
           f" FROM generate_series(1, 1000) g;"
           f" INSERT INTO {store} (key, fingerprint, token, state, expires_at, status, headers,"
           f" body) SELECT 'r' || g, {fp}, 7, 1, now() + interval '1 day',"
           f" 201, '\\x0102', repeat('x', 1024)::bytea FROM generate_series(1, 1000) g;")
    lease = "statement_timestamp() + 30000 * interval '1 millisecond'"

    def complete(t):
        return (f"WITH done AS (UPDATE {t} SET state = 1, status = 201, headers = '\\x0102',"
                f" body = repeat('x', 1024)::bytea, body_omitted = false, expires_at ="
                f" statement_timestamp() + interval '1 day' WHERE key = {key} AND token = 7 AND"
                f" state = 0 RETURNING key, watched) SELECT CASE WHEN done.watched THEN"
                f" pg_notify('c', done.key) END FROM done;")

    def insert(t):
        return (f"INSERT INTO {t} (key, fingerprint, token, state, expires_at) VALUES ({key}, {fp},"
                f" 7, 0, {lease}) ON CONFLICT (key) DO NOTHING;")

    returned = ("token, fingerprint, state, GREATEST(0, CEIL(EXTRACT(EPOCH FROM (expires_at -"
                " statement_timestamp())) * 1000))::bigint AS remaining_ms, status, headers, body,"
                " body_omitted")
    claim = (f"WITH live AS (SELECT {returned} FROM {store} WHERE key = {key} AND expires_at >"
             f" statement_timestamp()), next AS (SELECT 7::bigint AS token WHERE NOT EXISTS"
             f" (SELECT 1 FROM live)), ins AS (INSERT INTO {store} AS cur (key, fingerprint, token,"
             f" state, expires_at) SELECT {key}, {fp}, next.token, 0, {lease} FROM next ON CONFLICT"
             f" (key) DO UPDATE SET "
             + CLAIM_SET.format(old="cur.", now="statement_timestamp()", new="excluded.")
             + f" RETURNING {returned}) SELECT * FROM live UNION ALL SELECT * FROM ins;")
    cases = {
        "floor (INSERT + UPDATE, primary key only)":
            f"INSERT INTO {bare} (key, state) VALUES ({key}, 0);\n"
            f"UPDATE {bare} SET state = 1, body = repeat('x', 1024)::bytea WHERE key = {key};",
        "store: claim statement + complete": claim + "\n" + complete(store),
        "store: plain insert + complete": insert(store) + "\n" + complete(store),
        "store, no expires_at index": insert(noidx) + "\n" + complete(noidx),
        # A replay: the floor's primary-key read of the body, and the store's `get`.
        "read floor (SELECT body by key)":
            "\\set q random(1, 1000)\n"
            f"SELECT body FROM {bare} WHERE key = 'r' || :q;",
        "read: store's get (the record's columns)":
            "\\set q random(1, 1000)\n"
            f"SELECT {returned} FROM {store} WHERE key = 'r' || :q AND expires_at >"
            " statement_timestamp();",
    }
    psql = ["psql", "-q", "-v", "ON_ERROR_STOP=1", url]
    subprocess.run(psql + ["-c", ddl], check=True)
    results = {}
    try:
        with tempfile.TemporaryDirectory() as directory:
            for round_ in range(3):
                for n, (name, sql) in enumerate(cases.items()):
                    script = os.path.join(directory, f"{n}.sql")
                    with open(script, "w") as f:
                        f.write("\\set r random(1, 1000000000000)\n" + sql + "\n")
                    out = subprocess.run(
                        ["pgbench", "-n", "-M", "prepared", "-c", "8", "-j", "2", "-T", "8",
                         "-f", script, url], check=True, capture_output=True, text=True).stdout
                    tps = next(line for line in out.splitlines() if line.startswith("tps"))
                    results.setdefault(name, []).append(float(tps.split()[2]))
        # Rounds interleave the cases, so each case's median and range are comparable.
        for name, runs in results.items():
            runs.sort()
            print(f"{name:45} {runs[1]:7.0f} tps (runs {', '.join(f'{r:.0f}' for r in runs)})")
    finally:
        subprocess.run(psql + ["-c", f"DROP TABLE {store}, {bare}, {noidx}"], check=True)


if __name__ == "__main__":
    {"sqlite": sqlite, "postgres": postgres}[sys.argv[1] if len(sys.argv) > 1 else "sqlite"]()
