//! One module per subcommand; `Ctx` carries what every one of them needs.

pub mod access;
pub mod cancel;
pub mod checkpoint;
pub mod history;
pub mod jobs;
pub mod logs;
pub mod nodes;
pub mod pki;
pub mod sharing;
pub mod submit;

use crate::client::{self, Client};
use crate::{CliError, Output};

pub struct Ctx {
    pub server: Option<String>,
    pub output: Output,
    /// For connecting and for each answer; `None`: wait as long as it takes.
    pub timeout: Option<std::time::Duration>,
}

/// A connected client and the address it reached.
pub struct Connection {
    pub client: Client,
    pub addr: String,
}

impl Connection {
    pub fn refused(&self, status: tonic::Status) -> CliError {
        CliError::from_status(&self.addr, status)
    }

    /// The user gpoold takes the caller to be (`--me`, `history`).
    pub async fn my_name(&mut self) -> Result<String, CliError> {
        let me = self.client.who_am_i(gpool_proto::pb::WhoAmIRequest {}).await;
        Ok(me.map_err(|s| self.refused(s))?.into_inner().user)
    }
}

impl Ctx {
    pub async fn connect(&self) -> Result<Connection, CliError> {
        let addr = client::resolve_address(self.server.clone())?;
        let client = client::connect(&addr, self.timeout).await?;
        Ok(Connection { client, addr })
    }

    pub fn json(&self) -> bool {
        self.output == Output::Json
    }
}
