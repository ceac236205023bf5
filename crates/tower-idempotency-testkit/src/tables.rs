//! The tables a job table's `migrate` creates, for the tests that drop them at their end.

/// The suffixes of the tables `migrate` creates beside a job table (an inbox's or an outbox's):
/// its attempt history, its audit log, its pauses, and an inbox's ordering positions.
pub const JOB_SIDE_TABLES: [&str; 4] = ["_attempts", "_audit", "_pauses", "_positions"];

/// The job table `table` and the tables beside it, those first.
pub fn job_tables(table: &str) -> Vec<String> {
    JOB_SIDE_TABLES
        .iter()
        .map(|side| format!("{table}{side}"))
        .chain([table.to_owned()])
        .collect()
}

/// The statements that drop [`job_tables`] of `table` (`IF EXISTS`, one statement each: MySQL
/// drops one table per statement too), to run as one batch (`sqlx::raw_sql`, `psql -c`).
pub fn drop_job_tables_sql(table: &str) -> String {
    job_tables(table)
        .iter()
        .map(|name| format!("DROP TABLE IF EXISTS {name};"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn drops_the_side_tables_before_the_table() {
        assert_eq!(
            super::drop_job_tables_sql("t"),
            "DROP TABLE IF EXISTS t_attempts; DROP TABLE IF EXISTS t_audit; \
             DROP TABLE IF EXISTS t_pauses; DROP TABLE IF EXISTS t_positions; \
             DROP TABLE IF EXISTS t;"
        );
    }
}
