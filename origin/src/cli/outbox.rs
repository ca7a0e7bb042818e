//! `fanout outbox schema|init`: the producer's outbox table in the producer's own database
//! (PostgreSQL or SQLite), printed or created. It does not read or move any row (the daemon
//! does, with `serve --outbox`).

use clap::{Args, Subcommand};

use super::ClientError;
use crate::outbox::{self, OutboxLocation};

#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Print the DDL of the outbox for that kind of database (to review, or to add to the
    /// producer's own migrations)
    Schema(OutboxArgs),
    /// Create the outbox (the table, <table>_rejected and, on PostgreSQL, the NOTIFY
    /// trigger); running it again changes nothing
    Init(OutboxArgs),
}

#[derive(Debug, Args)]
pub struct OutboxArgs {
    /// The producer's database: postgres://user@host:port/dbname or a SQLite file
    #[arg(long, env = "FANOUT_OUTBOX")]
    pub db: String,
    /// The outbox's table
    #[arg(long, env = "FANOUT_OUTBOX_TABLE", default_value = outbox::DEFAULT_TABLE)]
    pub table: String,
}

fn location(a: &OutboxArgs) -> Result<OutboxLocation, ClientError> {
    outbox::plan::check_table(&a.table).map_err(ClientError::Input)?;
    OutboxLocation::parse(&a.db).map_err(|e| ClientError::Input(e.to_string()))
}

pub async fn run(command: OutboxCommand) -> Result<(), ClientError> {
    match command {
        OutboxCommand::Schema(a) => {
            print!("{}", outbox::schema(&location(&a)?, &a.table));
            Ok(())
        }
        OutboxCommand::Init(a) => {
            let at = location(&a)?;
            outbox::init(&at, &a.table)
                .await
                .map_err(|e| ClientError::Input(e.to_string()))?;
            eprintln!("the outbox {} is ready in {}", a.table, at.redacted());
            Ok(())
        }
    }
}
